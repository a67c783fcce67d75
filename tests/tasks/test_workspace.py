"""Directory tasks for agent harnesses: the starting files, and rewards from a check of the directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentjet.tasks.workspace import WorkspaceTaskError, check, prepare

ROOT = Path(__file__).resolve().parents[2]
TASKS = {t["task_id"]: t for t in map(json.loads, (ROOT / "examples" / "data" / "workspace.jsonl").read_text().splitlines())}


def test_the_file_task_is_checked_on_the_directory_not_on_words(tmp_path: Path) -> None:
    task = TASKS["hello-file"]
    prepare(task, tmp_path / "w")
    assert check(task, tmp_path / "w") == 0.0  # nothing written yet
    (tmp_path / "w" / "hello.txt").write_text("hi\n")
    assert check(task, tmp_path / "w") == 1.0
    (tmp_path / "w" / "hello.txt").write_text("hello")
    assert check(task, tmp_path / "w") == 0.0
    assert check({"check": {"file": "hello.txt", "contains": "ell"}}, tmp_path / "w") == 1.0


def test_the_bug_fix_task_runs_the_fixed_code(tmp_path: Path) -> None:
    task = TASKS["fix-add"]
    work = tmp_path / "w"
    prepare(task, work)
    assert (work / "calc.py").read_text().startswith("def add")
    assert check(task, work) == 0.0  # the bug is there
    (work / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    assert check(task, work) == 1.0
    (work / "calc.py").write_text("import time\ntime.sleep(30)\ndef add(a, b):\n    return a + b\n")
    assert check({**task, "check": {**task["check"], "timeout_s": 1}}, work) == 0.0  # a hang is a fail


def test_paths_that_leave_the_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceTaskError, match="leaves its directory"):
        prepare({"files": {"../escape.txt": "x"}}, tmp_path / "w")
    assert not (tmp_path / "escape.txt").exists()
    with pytest.raises(WorkspaceTaskError, match="leaves its directory"):
        check({"check": {"file": "/etc/hostname", "contains": ""}}, tmp_path / "w")
    with pytest.raises(WorkspaceTaskError, match="a check is"):
        check({"task_id": "x", "check": {"file": "a"}}, tmp_path / "w")
