"""The docs stay complete and true: every route of the app is in docs/protocol.md, every setting in
docs/configuration.md, and every path and dotted name the docs and docstrings give exists."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

from agentjet.server.http.app import create_app
from agentjet.server.swarm import SwarmServer
from agentjet.settings import ServerConfig, server_fields

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_route_is_documented(tmp_path: Path, tiny_model_path: Path) -> None:
    from transformers import AutoTokenizer

    from agentjet.layouts.null import null_engine

    config = ServerConfig(model=str(tiny_model_path), data_dir=tmp_path, admin_token="adm1n")
    app = create_app(SwarmServer(config, null_engine(AutoTokenizer.from_pretrained(tiny_model_path))))
    doc = (DOCS / "protocol.md").read_text()
    routes = [(method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops]
    assert len(routes) >= 19
    missing = [f"{m} {p}" for m, p in routes if f"`{m} {p}`" not in doc]
    assert not missing, f"routes missing from docs/protocol.md: {missing}"


def test_every_setting_is_documented() -> None:
    doc = (DOCS / "configuration.md").read_text()
    missing = [f.dotted for f in server_fields() if f"`--{f.flag}`" not in doc or f"`{f.env}`" not in doc]
    assert not missing, f"settings missing from docs/configuration.md: {missing}"
    from agentjet.settings.__main__ import page, table

    assert table() in doc
    assert doc == page(), "docs/configuration.md is stale: python -m agentjet.settings > docs/configuration.md"


def test_every_package_is_named_in_the_architecture() -> None:
    """docs/architecture.md names every package and sub-package of agentjet (as ``agentjet/x/`` or ``x/``), so
    a new room cannot appear without a place on the map; and its floor picture names every top-level package."""
    import agentjet

    src = Path(agentjet.__file__).resolve().parent
    text = (DOCS / "architecture.md").read_text()
    packages = sorted(p.parent.relative_to(src).as_posix() for p in src.rglob("__init__.py")
                      if p.parent != src and "static" not in p.parts)
    missing = [pkg for pkg in packages if f"agentjet/{pkg}/" not in text and f"`{pkg}/" not in text]
    assert missing == [], f"packages missing from docs/architecture.md: {missing}"
    floors = text.split("## Packages and their floors", 1)[1].split("```")[1]
    top = sorted({pkg.split("/")[0] for pkg in packages})
    assert [pkg for pkg in top if pkg not in floors] == [], "every top-level package has a floor in the picture"



def test_the_floors_table_is_the_one_the_imports_make() -> None:
    """docs/architecture.md's table of floors is what scripts/floors.py measures from the imports now (a room that
    moves, or a new arrow, makes them part), and that measure finds no arrow against the contract's layers."""
    import subprocess
    import sys

    root = DOCS.parent
    out = subprocess.run([sys.executable, str(root / "scripts" / "floors.py")], capture_output=True, text=True,
                         check=True, cwd=root).stdout.strip()
    assert " 0 against the contract's layers" in out, out
    text = (DOCS / "architecture.md").read_text()
    drawn = text.split("<!-- floors:begin -->\n", 1)[1].split("\n<!-- floors:end -->", 1)[0]
    assert drawn == out, "docs/architecture.md's floors are stale: .venv/bin/python scripts/floors.py"

# ---- every repository path and dotted name the docs and docstrings give exists ----------------------------------

ROOT = DOCS.parent
SRC = ROOT / "src" / "agentjet"
# Another project's files are written with that project's name first (``vllm/v1/worker/gpu_worker.py``,
# ``vllm-project/vllm/docs/...``): theirs, not checked here.
THEIRS = ("vllm/", "vllm-project/", "transformers/", "torch/", "tinker/", "tinker_cookbook/", "verifiers/", "trl/",
          "peft/", "reasoning_gym/", "textarena/", "openai/", "anthropic/", "codex-rs/", "node_modules/")
# Files a run writes (``runs/demo/demo_result.json``) are not repository files; repository data under these roots is.
REPO_ROOTS = {"benchmarks", "docs", "examples", "scripts", "src", "tests", ".ci"}
_PATH = re.compile(r"(?<![\w./:@-])((?:[A-Za-z_.][\w.-]*/)+[A-Za-z_][\w-]*\.(?:py|md|sh|toml|json|jsonl|yaml|yml|png))"
                   r"(?![\w/-])")
_DOTTED = re.compile(r"(?<![\w./-])(agentjet(?:\.[A-Za-z_]\w*)+)")


def _doc_texts() -> Iterator[tuple[Path, str]]:
    """docs/ and the README, and every docstring and comment under src/agentjet."""
    for md in sorted(DOCS.rglob("*.md")):
        yield md, md.read_text()
    yield ROOT / "README.md", (ROOT / "README.md").read_text()
    for py in sorted(SRC.rglob("*.py")):
        source = py.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    yield py, doc
        comments = [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                    if tok.type == tokenize.COMMENT]
        yield py, "\n".join(comments)


def _path_exists(path: str, where: Path) -> bool:
    if path.startswith(THEIRS) or path.startswith("../"):  # another project's, or outside the repository
        return True
    first = path.split("/", 1)[0]
    if first.isupper() or path.startswith("path/to/"):  # a placeholder (``DIR/spec.yaml``)
        return True
    if not path.endswith((".py", ".md", ".sh", ".toml")) and first not in REPO_ROOTS:
        return True  # an output file a run writes
    bases = [ROOT, ROOT / "src", SRC, *where.parents]
    return any((base / path).exists() for base in bases if ROOT in (base, *base.parents))


def _top_names(module: Path) -> dict[str, ast.AST]:
    tree = ast.parse(module.read_text())
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
        elif isinstance(node, ast.ImportFrom | ast.Import):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
    return names


def _dotted_exists(name: str) -> bool:
    """``agentjet.a.b`` is a module or package, or a module followed by a top-level name and, for a class, one of
    its members: read from the source, so that a module needing an optional extra counts too."""
    parts = name.split(".")[1:]
    here = SRC
    for i, part in enumerate(parts):
        if (here / part).is_dir() and (here / part / "__init__.py").exists():
            here = here / part
            continue
        module = here / f"{part}.py" if (here / f"{part}.py").exists() else here / "__init__.py"
        rest = parts[i + 1:] if module.name != "__init__.py" else parts[i:]
        if not module.exists():
            return False
        names = _top_names(module)
        if not rest:
            return True
        node = names.get(rest[0])
        if node is None:
            return False
        if len(rest) == 1 or not isinstance(node, ast.ClassDef):
            return len(rest) == 1 or not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        members = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
        members |= {t.id for n in node.body if isinstance(n, ast.AnnAssign | ast.Assign)
                    for t in ast.walk(n.target if isinstance(n, ast.AnnAssign) else n.targets[0])
                    if isinstance(t, ast.Name)}
        return rest[1] in members
    return True


def dead_references() -> dict[str, set[str]]:
    dead: dict[str, set[str]] = {}
    for where, text in _doc_texts():
        found = [p for p in _PATH.findall(text) if not _path_exists(p, where)]
        found += [d for d in _DOTTED.findall(text) if not _dotted_exists(d)]
        for ref in found:
            dead.setdefault(ref, set()).add(where.relative_to(ROOT).as_posix())
    return dead


def test_every_path_and_dotted_name_in_the_docs_exists() -> None:
    """A doc page, a docstring or a comment that names ``dir/file.py`` or ``agentjet.x.y`` names something that is
    there (after a move, the docs move too)."""
    dead = dead_references()
    assert dead == {}, "dead references (name -> where):\n" + "\n".join(
        f"  {ref} <- {', '.join(sorted(places))}" for ref, places in sorted(dead.items()))


def test_the_dead_reference_scan_finds_a_planted_one(tmp_path: Path) -> None:
    """The scan is not vacuous: a moved file, a missing module and a missing name are each found; a file of
    another project, a placeholder and an output a run writes are not."""
    where = SRC / "server" / "swarm.py"
    assert not _path_exists("engines/batcher.py", where)
    assert not _path_exists("server/admission.py", where)
    assert _path_exists("server/episodes/admission.py", where) and _path_exists("episodes/admission.py", where)
    assert _path_exists("vllm/v1/worker/gpu_worker.py", where) and _path_exists("DIR/spec.yaml", where)
    assert _path_exists("runs/demo/demo_result.json", where)
    assert not _path_exists("benchmarks/results/no_such_result.json", where)
    assert _dotted_exists("agentjet.server.episodes.chat_call.ChatCall")
    assert _dotted_exists("agentjet.apps.research.ray_executor")  # needs the ray extra to import; read, not imported
    assert not _dotted_exists("agentjet.engines.batcher")
    assert not _dotted_exists("agentjet.server.episodes.chat_call.NoSuchName")
    assert not _dotted_exists("agentjet.server.episodes.chat_call.ChatCall.no_such_method")
