"""The workspace runner: a harness (here a small python program standing in for a CLI) runs in the task's directory
with a home of its own, its reward is the directory check, and one that runs too long is stopped."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest

from agentjet.client.workspace import HarnessNotFound, Workspace, find_harness

TASK = {"task_id": "hello-file", "prompt": "write hello.txt", "files": {"notes/readme.txt": "start"},
        "check": {"file": "hello.txt", "equals": "hi"}}


def test_the_harness_runs_in_the_directory_with_a_home_of_its_own(tmp_path: Path) -> None:
    program = ("import os, pathlib; pathlib.Path('hello.txt').write_text('hi');"
               "print(os.environ['HOME'], open('notes/readme.txt').read())")
    with Workspace(TASK) as ws:
        env = ws.base_env({"EXTRA": "1"})
        assert env["HOME"] == str(ws.home) and env["EXTRA"] == "1" and env["PATH"]
        run = asyncio.run(ws.run([sys.executable, "-c", program], env, timeout_s=60))
        root = ws.root
        assert run.log_tail.strip() == f"{ws.home} start"
    assert (run.reward, run.returncode, run.timed_out) == (1.0, 0, False)
    assert run.metadata()["harness_returncode"] == 0
    assert not root.exists()  # removed on exit


def test_a_failed_or_hung_harness_scores_zero(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with Workspace(TASK, keep=True) as ws:
        failed = asyncio.run(ws.run([sys.executable, "-c", "print('no luck'); raise SystemExit(3)"], ws.base_env(),
                                    timeout_s=60))
        hung = asyncio.run(ws.run([sys.executable, "-c", "import time; time.sleep(60)"], ws.base_env(), timeout_s=1))
    assert (failed.reward, failed.returncode) == (0.0, 3) and "no luck" in failed.log_tail
    assert "exited with 3" in caplog.text and "no luck" in caplog.text
    assert hung.timed_out and hung.reward == 0.0 and hung.seconds < 30
    assert ws.root.exists()  # keep=True
    shutil.rmtree(ws.root)


def test_find_harness_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AGENTJET_NOPE", raising=False)
    with pytest.raises(HarnessNotFound, match="make setup-harnesses"):
        find_harness("agentjet-no-such-cli", "AGENTJET_NOPE", tmp_path)
    (tmp_path / "node_modules" / ".bin").mkdir(parents=True)
    (tmp_path / "node_modules" / ".bin" / "agentjet-no-such-cli").write_text("")
    assert find_harness("agentjet-no-such-cli", "AGENTJET_NOPE", tmp_path).startswith(str(tmp_path))
    monkeypatch.setenv("AGENTJET_NOPE", "/opt/cli")
    assert find_harness("agentjet-no-such-cli", "AGENTJET_NOPE", tmp_path) == "/opt/cli"
