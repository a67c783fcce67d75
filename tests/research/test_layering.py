"""The research room imports only lower floors (up, client, protocol, tasks, and the shared records, files and
clock below them) and nothing but the CLI imports it."""

from __future__ import annotations

import ast
from pathlib import Path

import agentjet

SRC = Path(agentjet.__file__).parent
ALLOWED = {"agentjet.apps.up", "agentjet.runtime.launch", "agentjet.runtime.proc", "agentjet.runtime.clock",
           "agentjet.settings", "agentjet.client", "agentjet.protocol", "agentjet.tasks", "agentjet.files",
           "agentjet.observe.learncurve", "agentjet.observe.curveplot", "agentjet.apps.research"}
RESEARCH = SRC / "apps" / "research"


def agentjet_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agentjet"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("agentjet")}
    return out


def test_research_imports_only_lower_floors() -> None:
    paths = sorted(RESEARCH.glob("*.py"))
    assert len(paths) > 10, RESEARCH  # the room is where this test looks
    for path in paths:
        for module in agentjet_imports(path):
            assert any(module == a or module.startswith(a + ".") for a in ALLOWED), (path.name, module)


def test_nothing_but_the_cli_imports_research() -> None:
    for path in SRC.rglob("*.py"):
        if "research" in path.parts or "cli" in path.parts:
            continue
        assert not any(m.startswith("agentjet.apps.research") for m in agentjet_imports(path)), path
