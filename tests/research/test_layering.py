"""The research room imports only lower floors (up, client, protocol, tasks) and nothing but the CLI imports it."""

from __future__ import annotations

import ast
from pathlib import Path

import agentjet

SRC = Path(agentjet.__file__).parent
ALLOWED = {"agentjet.apps.up", "agentjet.runtime.launch", "agentjet.runtime.proc", "agentjet.settings", "agentjet.client", "agentjet.protocol",
           "agentjet.tasks", "agentjet.apps.research"}


def agentjet_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agentjet"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("agentjet")}
    return out


def test_research_imports_only_lower_floors() -> None:
    for path in (SRC / "research").glob("*.py"):
        for module in agentjet_imports(path):
            assert any(module == a or module.startswith(a + ".") for a in ALLOWED), (path.name, module)


def test_nothing_but_the_cli_imports_research() -> None:
    for path in SRC.rglob("*.py"):
        if "research" in path.parts or "cli" in path.parts:
            continue
        assert not any(m.startswith("agentjet.apps.research") for m in agentjet_imports(path)), path
