"""The extras stay honest: every third-party package the code imports is declared (a dependency or an extra),
and the base install, without any extra, starts the CLI, the client SDK and the server."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "agentjet"
# imported directly, and always installed by a declared dependency (the one named)
GUARANTEED = {"starlette": "fastapi", "annotated_types": "pydantic"}
EXTRAS = ("vllm", "lora", "plot", "langchain", "tracking", "research", "ray", "rg", "ta", "bench", "tinker", "harnesses",
          "dev")
# Files that run in a venv of their own, not AgentJet's, and what they import there (installed by a setup script).
OTHER_VENVS = {SRC / "apps" / "verifiers" / "worker.py": ("verifiers", ROOT / "scripts" / "setup_verifiers.sh")}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {k: {_name(r) for r in v} for k, v in project["optional-dependencies"].items()}
    return {_name(r) for r in project["dependencies"]}, extras


def imported_modules() -> set[str]:
    found = set()
    for f in SRC.rglob("*.py"):
        if f in OTHER_VENVS:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in ("agentjet", "__future__")}


def test_the_extras_are_the_documented_ones() -> None:
    from agentjet.settings.models import VLLM_VERSION

    _, extras = declared()
    assert set(extras) == set(EXTRAS)
    raw = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert raw["vllm"] == [f"vllm=={VLLM_VERSION}"]  # the version the adapter speaks to, as make setup-vllm


def test_every_imported_package_is_declared() -> None:
    base, extras = declared()
    everything = base | set().union(*extras.values())
    dists = importlib.metadata.packages_distributions()
    missing = []
    for module in sorted(imported_modules()):
        if module in GUARANTEED:
            assert GUARANTEED[module] in base
            continue
        names = {_name(d) for d in dists.get(module, [module])}
        if not names & everything:
            missing.append(f"{module} (from {sorted(names)})")
    assert not missing, f"imported but declared nowhere in pyproject.toml: {missing}"


def test_what_runs_in_another_venv_is_installed_there() -> None:
    """The verifiers worker runs in .venv-verifiers (verifiers pins openai<3): its setup script installs it."""
    for path, (module, script) in OTHER_VENVS.items():
        assert path.exists() and f'install "{module}==$' in script.read_text(), (path, script)


def test_the_base_install_runs_without_any_extra() -> None:
    """With every package that only an extra brings made unimportable, the CLI's commands, the client SDK and
    the server's app still import and answer --help."""
    base, extras = declared()
    only_extras = set().union(*(v for k, v in extras.items() if k != "dev")) - base
    dists = importlib.metadata.packages_distributions()
    blocked = sorted({m for m, ds in dists.items() if {_name(d) for d in ds} & only_extras} | only_extras)
    code = (f"import sys; sys.modules.update(dict.fromkeys({blocked!r}))\n"  # None: ImportError on import
            "import agentjet, agentjet.server.http.app, agentjet.apps.export\n"
            "from typer.testing import CliRunner\n"
            "from agentjet.cli import app\n"
            "for args in (['--help'], ['server', '--help'], ['run', '--help'], ['export', '--help'], "
            "['model', '--help'], ['research', '--help']):\n"
            "    r = CliRunner().invoke(app, args)\n"
            "    assert r.exit_code == 0, (args, r.output, r.exception)\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
