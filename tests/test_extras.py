"""The extras stay honest: every third-party package the code imports is declared (a dependency or an extra);
the base install, without any extra, starts the CLI and the client SDK; the ``server`` extra alone adds the
server; and a server command without it says which extra to install."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "agentjet"
# imported directly, and always installed by a declared dependency (the one named: in the base or the server extra)
GUARANTEED = {"starlette": "fastapi", "annotated_types": "pydantic"}
EXTRAS = ("server", "vllm", "lora", "plot", "langchain", "tracking", "research", "ray", "rg", "ta", "bench", "tinker",
          "harnesses", "dev")
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
    from agentjet.generators.vllm.launch import VLLM_VERSION

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
            assert GUARANTEED[module] in base | extras["server"]
            continue
        names = {_name(d) for d in dists.get(module, [module])}
        if not names & everything:
            missing.append(f"{module} (from {sorted(names)})")
    assert not missing, f"imported but declared nowhere in pyproject.toml: {missing}"


def test_what_runs_in_another_venv_is_installed_there() -> None:
    """The verifiers worker runs in .venv-verifiers (verifiers pins openai<3): its setup script installs it."""
    for path, (module, script) in OTHER_VENVS.items():
        assert path.exists() and f'install "{module}==$' in script.read_text(), (path, script)


def _blocked(keep: tuple[str, ...] = ()) -> list[str]:
    """Every importable name of a package that only an extra brings (none of ``keep``'s, nor dev's)."""
    base, extras = declared()
    kept = set().union(*(extras[k] for k in keep)) if keep else set()
    only_extras = set().union(*(v for k, v in extras.items() if k not in ("dev", *keep))) - base - kept
    dists = importlib.metadata.packages_distributions()
    return sorted({m for m, ds in dists.items() if {_name(d) for d in ds} & only_extras} | only_extras)


def _run_blocked(blocked: list[str], body: str) -> None:
    code = f"import sys; sys.modules.update(dict.fromkeys({blocked!r}))\n" + body  # None: ImportError on import
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_base_install_runs_the_client_and_the_cli_without_any_extra() -> None:
    """With every package that only an extra brings made unimportable (the server's included), the client SDK,
    its runner and driver import, and every command answers --help."""
    blocked = _blocked()
    assert {"torch", "transformers", "fastapi", "uvicorn"} <= set(blocked)
    _run_blocked(blocked, (
        "import agentjet, agentjet.client.driver, agentjet.client.scheduled, agentjet.client.runner\n"
        "from typer.testing import CliRunner\n"
        "from agentjet.cli import app\n"
        "for args in (['--help'], ['server', '--help'], ['run', '--help'], ['status', '--help'], "
        "['ctl', '--help'], ['demo', '--help'], ['export', '--help'], ['model', '--help'], "
        "['research', '--help']):\n"
        "    r = CliRunner().invoke(app, args)\n"
        "    assert r.exit_code == 0, (args, r.output, r.exception)\n"
        "print('ok')\n"))


def test_the_server_extra_alone_runs_the_server() -> None:
    """With every package that only another extra brings made unimportable, the server's app and the CLI's
    server commands still import and answer --help."""
    blocked = _blocked(keep=("server",))
    assert "torch" not in blocked and "peft" in blocked
    _run_blocked(blocked, (
        "import agentjet, agentjet.server.http.app, agentjet.apps.export, agentjet.apps.demo\n"
        "from typer.testing import CliRunner\n"
        "from agentjet.cli import app\n"
        "for args in (['--help'], ['server', '--help'], ['run', '--help'], ['export', '--help'], "
        "['model', '--help'], ['research', '--help']):\n"
        "    r = CliRunner().invoke(app, args)\n"
        "    assert r.exit_code == 0, (args, r.output, r.exception)\n"
        "print('ok')\n"))


def test_a_server_command_without_the_server_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ajet server`` (and the other server commands) in a base install: the missing packages and the install
    line, before anything imports torch."""
    from typer.testing import CliRunner

    from agentjet.cli import app
    from agentjet.cli.common import missing_server_packages

    assert missing_server_packages() == []  # this venv has the extra
    real = importlib.metadata.version

    def version(dist: str) -> str:
        if dist.lower() in ("torch", "fastapi"):
            raise importlib.metadata.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert missing_server_packages() == ["torch", "fastapi"]
    for args in (["server"], ["demo"], ["model", "tiny-random"], ["export", "a", "b"], ["up", "swarm.yaml"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert "needs the server extra (torch, fastapi not installed)" in r.output, r.output
        assert "pip install 'agentjet[server]'" in r.output, r.output
