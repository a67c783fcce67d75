"""The bound on a class (issue 47: no god class grows back): none in src/agentjet over 300 lines or 25 methods
(a method: a def in the class's own body, properties and nested functions' parents included; lines: from the
``class`` line to its last, docstrings and comments included)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "agentjet"
MAX_LINES, MAX_METHODS = 300, 25


def oversized(source: str, name: str) -> list[str]:
    """Each class of ``source`` over the bound, as ``name:Class (lines, methods)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            methods = sum(isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef) for b in node.body)
            if lines > MAX_LINES or methods > MAX_METHODS:
                found.append(f"{name}:{node.name} ({lines} lines, {methods} methods)")
    return found


def test_no_class_is_over_300_lines_or_25_methods() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 200
    found = [c for f in files for c in oversized(f.read_text(encoding="utf-8"), str(f.relative_to(SRC)))]
    assert found == [], f"split these by concern: {found}"


def test_the_bound_finds_a_planted_class() -> None:
    methods = "\n".join(f"    def m{i}(self):\n        return {i}" for i in range(MAX_METHODS + 1))
    assert oversized(f"class Big:\n{methods}\n", "planted.py") == ["planted.py:Big (53 lines, 26 methods)"]
    long_body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    assert oversized(f"class Long:\n{long_body}\n", "planted.py") == ["planted.py:Long (301 lines, 0 methods)"]
    assert oversized("class Small:\n    def m(self):\n        return 1\n", "planted.py") == []
