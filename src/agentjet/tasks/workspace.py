"""Tasks done in a directory, for agent harnesses (Codex CLI, Claude Code) run unchanged: the task's starting files are
written into a fresh directory, the harness works there, and the reward is a check of the directory afterwards,
never the model's words (``examples/codex_task.py``, ``examples/claude_code_task.py``; tasks in
``examples/data/workspace.jsonl``).

A task is one JSON object::

    {"task_id": "hello", "prompt": "Create a file hello.txt containing the word hi",
     "files": {"calc.py": "..."},                      # optional: the starting files (relative paths)
     "check": {"file": "hello.txt", "equals": "hi"}}   # or {"file", "contains"}, or {"python": "..."}

- ``{"file": F, "equals": T}``: F's text, stripped, is T (1.0), else 0.0 (also when F is missing);
- ``{"file": F, "contains": T}``: T occurs in F's text;
- ``{"python": CODE}``: CODE, run by this interpreter with the directory as its working directory and first on
  ``sys.path`` (say ``from calc import add; assert add(2, 3) == 5``), exits 0 within ``timeout_s`` (default 20).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

PYTHON_CHECK_TIMEOUT_S = 20.0


class WorkspaceTaskError(ValueError):
    """A task that cannot be set up or checked as written (a path leaving the directory, an unknown check)."""


def _inside(directory: Path, name: str) -> Path:
    path = (directory / name).resolve()
    if not path.is_relative_to(directory.resolve()):
        raise WorkspaceTaskError(f"the task's path {name!r} leaves its directory")
    return path


def prepare(task: dict[str, Any], directory: Path) -> None:
    """Create ``directory`` and write the task's starting files into it."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in dict(task.get("files") or {}).items():
        path = _inside(directory, str(name))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(str(text))


def check(task: dict[str, Any], directory: Path) -> float:
    """1.0 when ``directory`` passes the task's check, else 0.0."""
    spec = task.get("check")
    if not isinstance(spec, dict):
        raise WorkspaceTaskError(f"task {task.get('task_id')!r} has no check")
    if "python" in spec:
        return _python_check(str(spec["python"]), directory, float(spec.get("timeout_s", PYTHON_CHECK_TIMEOUT_S)))
    if "file" not in spec or not ({"equals", "contains"} & spec.keys()):
        raise WorkspaceTaskError(f"task {task.get('task_id')!r}: a check is {{file, equals}}, {{file, contains}} "
                                 "or {python}")
    path = _inside(directory, str(spec["file"]))
    try:
        text = path.read_text(errors="replace")
    except (FileNotFoundError, IsADirectoryError):
        return 0.0
    if "equals" in spec:
        return float(text.strip() == str(spec["equals"]))
    return float(str(spec["contains"]) in text)


def _python_check(code: str, directory: Path, timeout_s: float) -> float:
    program = f"import sys; sys.path.insert(0, {str(directory)!r})\n{code}\n"
    try:
        done = subprocess.run([sys.executable, "-c", program], cwd=directory, capture_output=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return 0.0
    return float(done.returncode == 0)
