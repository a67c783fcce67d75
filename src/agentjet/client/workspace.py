"""An agent harness (Codex CLI, Claude Code, any program) run as one episode's agent on a directory task
(``agentjet.tasks.workspace``): the task's files in a fresh temporary directory, the harness as a child process
working there with the episode's environment (``Episode.env()``), and the reward from a check of the directory.

    with Workspace(task) as ws:
        env = ep.env(base=ws.base_env(), codex_home=ws.scratch / "codex")
        run = await ws.run(["codex", "exec", ...], env, timeout_s=600)
        return run.reward

The harness gets a home of its own (``HOME`` in ``base_env``), so a user's own settings, logins and history stay
out of the episode and nothing it writes there outlives it. What keeps it inside the directory is the harness's own
sandbox or permission settings (``examples/codex_task.py``, ``examples/claude_code_task.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from agentjet.runtime.proc import Child
from agentjet.tasks.workspace import check, prepare

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0  # a harness past its timeout: SIGTERM, then SIGKILL after this


class HarnessNotFound(FileNotFoundError):
    """The harness's program is not installed where it was looked for."""


def find_harness(name: str, env_var: str, prefix: Path | None = None) -> str:
    """The program ``name``: ``$env_var`` when set, else ``prefix/node_modules/.bin/name`` (an npm prefix such as
    the ``.harnesses`` folder ``make setup-harnesses`` fills), else ``name`` on ``PATH``."""
    if os.environ.get(env_var):
        return os.environ[env_var]
    if prefix is not None and (prefix / "node_modules" / ".bin" / name).exists():
        return str(prefix / "node_modules" / ".bin" / name)
    found = shutil.which(name)
    if found is None:
        raise HarnessNotFound(f"{name} was not found (${env_var}, {prefix}/node_modules/.bin, PATH): run "
                              "`make setup-harnesses`, or set ${env_var} to the program")
    return found


@dataclass(frozen=True)
class HarnessRun:
    """How one harness run ended, and the directory check's reward."""

    reward: float
    returncode: int | None  # None: killed at the timeout
    seconds: float
    log_tail: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def metadata(self) -> dict[str, Any]:
        """What goes beside the reward (``ep.reward(run.reward, **run.metadata())``)."""
        return {"harness_returncode": self.returncode, "harness_seconds": round(self.seconds, 2)}


class Workspace:
    """A temporary folder holding the task's directory (``dir``, its files written), a home for the harness
    (``home``) and scratch space (``scratch``: a Codex home, logs); removed on exit unless ``keep``."""

    def __init__(self, task: dict[str, Any], keep: bool = False) -> None:
        self.task = task
        self.keep = keep
        self.root = Path(tempfile.mkdtemp(prefix="agentjet-workspace-"))
        self.dir = self.root / "work"
        self.home = self.root / "home"
        self.scratch = self.root / "scratch"

    def __enter__(self) -> Workspace:
        prepare(self.task, self.dir)
        self.home.mkdir()
        self.scratch.mkdir()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def base_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment with ``HOME`` (and the XDG folders) moved to the workspace's home, plus
        ``extra``: the ``base`` of ``Episode.env``."""
        return {**os.environ, "HOME": str(self.home), "XDG_CONFIG_HOME": str(self.home / ".config"),
                "XDG_CACHE_HOME": str(self.home / ".cache"), "XDG_DATA_HOME": str(self.home / ".local" / "share"),
                **(extra or {})}

    async def run(self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> HarnessRun:
        """Run ``argv`` in ``dir`` (stdin from /dev/null, output to ``scratch/harness.log``) until it exits or
        ``timeout_s`` passes (then it is stopped), and check the directory."""
        log_path = self.scratch / "harness.log"
        start = time.monotonic()
        child = Child.spawn(argv, log_path, env=env, cwd=self.dir, append=False)
        try:
            code = await asyncio.to_thread(child.wait, timeout_s)
        finally:
            if child.alive():
                await asyncio.to_thread(child.stop, STOP_GRACE_S)
        run = HarnessRun(check(self.task, self.dir), code, time.monotonic() - start, child.tail(40))
        if code != 0:
            log.warning("%s %s after %.0f s on task %s; its output ends:\n%s", Path(argv[0]).name,
                        "timed out" if code is None else f"exited with {code}", run.seconds,
                        self.task.get("task_id"), run.log_tail)
        return run
