"""The observe room sits below the server: it imports no server, client or higher floor (the server mounts it)."""

from __future__ import annotations

import ast
from pathlib import Path

import agentjet.observe

HIGHER = ("agentjet.server", "agentjet.client", "agentjet.demo", "agentjet.up", "agentjet.cli",
          "agentjet.bench_suite")


def test_observe_imports_no_higher_floor() -> None:
    room = Path(agentjet.observe.__file__).parent
    offenders = []
    for path in sorted(room.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n.startswith(HIGHER)]
    assert offenders == []
