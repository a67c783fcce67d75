"""One run's `ajet up` process: launched by this study process, or re-attached to after a restart.

A process is known by its pid and its start time, so a pid the system has since reused is never taken
for ours. `ajet up` runs in a session of its own: it outlives a killed study process, stops its own
servers when its client is done, and stops everything cleanly on SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import psutil

from agentjet.runtime.proc import REAL_TIME, Child, Timer

START_TIME_TOLERANCE_S = 0.05


class TrialProcess:
    def __init__(self, pid: int, create_time: float, child: Child | None = None,
                 children: list[tuple[int, float]] | None = None, timer: Timer = REAL_TIME) -> None:
        self.pid = pid
        self.create_time = create_time
        self._child = child
        self.timer = timer
        self.children: list[tuple[int, float]] = list(children or [])  # (pid, start time) of servers, clients

    def refresh_children(self) -> bool:
        """Remember `ajet up`'s children (servers, clients), so they can be stopped even if it dies first.
        True when the list changed."""
        proc = self._process()
        if proc is None:
            return False
        try:
            now = sorted((c.pid, c.create_time()) for c in proc.children(recursive=True))
        except psutil.Error:
            return False
        known = {pid for pid, _ in self.children}
        added = [c for c in now if c[0] not in known]
        self.children += added
        return bool(added)

    @classmethod
    def launch(cls, swarm_file: Path, log_path: Path, env: dict[str, str] | None = None,
               timer: Timer = REAL_TIME, die_with_owner: bool = False) -> TrialProcess:
        """Start `ajet up` in a session of its own. ``die_with_owner``: SIGTERM it when the launching thread
        dies (a Ray actor whose node goes away must not leave a trial behind; `ajet up` then stops its
        servers, which die with it too)."""
        child = Child.spawn([sys.executable, "-m", "agentjet.cli", "up", str(swarm_file)], log_path,
                            env={**os.environ, **(env or {})}, timer=timer,
                            parent_death_signal=signal.SIGTERM if die_with_owner else None)
        try:
            created = psutil.Process(child.pid).create_time()
        except psutil.Error:  # it already exited: alive() says so
            created = 0.0
        return cls(child.pid, created, child, timer=timer)

    @classmethod
    def attach(cls, pid: int, create_time: float, children: list[tuple[int, float]] | None = None) -> TrialProcess:
        """The process of an earlier study session, alive or not (stop() also ends its orphaned children)."""
        return cls(pid, create_time, children=children)

    def _process(self) -> psutil.Process | None:
        if self.pid <= 0:
            return None
        try:
            p = psutil.Process(self.pid)
            if abs(p.create_time() - self.create_time) > START_TIME_TOLERANCE_S:
                return None
            return None if p.status() == psutil.STATUS_ZOMBIE else p
        except psutil.Error:
            return None

    def alive(self) -> bool:
        if self._child is not None:
            return self._child.alive()
        return self._process() is not None

    def stop(self, grace_s: float) -> None:
        """SIGTERM `ajet up` (it stops its clients, then its servers); after ``grace_s``, SIGKILL it and
        whatever of its children is left, each by pid and start time."""
        self.refresh_children()
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGTERM)
            self.timer.wait_until(lambda: not self.alive(), grace_s)
        for pid, created in [(self.pid, self.create_time), *self.children]:
            kill_if_same(pid, created)
        if self._child is not None:  # reap it
            self._child.kill()


def kill_if_same(pid: int, create_time: float) -> None:
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - create_time) <= START_TIME_TOLERANCE_S and p.status() != psutil.STATUS_ZOMBIE:
            p.kill()
    except psutil.Error:
        pass
