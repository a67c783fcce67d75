"""The one process supervisor: start a child in a session of its own with its output in a log file, signal its
whole process group, stop it with SIGTERM then SIGKILL after a grace period, and read the log's tail.

Every child AgentJet starts goes through :class:`Child`: the servers of ``ajet up`` and the demo
(``launch.ServerProcess``), the clients of ``ajet up``, a study's ``ajet up`` (``apps/research/process.py``), the
managed ``vllm serve`` (``generators/vllm/process.py``) and torchrun for a trainer group
(``distributed/group.py``). The parent-death signal and :func:`free_port` live here too.

A child runs in its own session, so a Ctrl-C in the parent's terminal does not reach it (the parent stops it,
in order), and signalling its group also reaches what it forked (vLLM's engine core, a server's ranks).
Grace periods run on an injectable clock and sleep, so the SIGTERM-then-SIGKILL rule is tested without waiting.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentjet.runtime.clock import Clock, SystemClock

PR_SET_PDEATHSIG = 1
KILL_WAIT_S = 10.0  # after SIGKILL a process is gone in milliseconds; this only bounds a stuck kernel


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Linux: deliver ``sig`` to this process when its parent *thread* dies (``PR_SET_PDEATHSIG``), so a
    hard-killed owner leaves no orphan behind. Call it in the child: as a ``preexec_fn`` (between fork and exec),
    or first thing in a child's own code. A no-op elsewhere."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file (``"(no log)"`` if it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass(frozen=True)
class Timer:
    """How a supervisor waits: ``clock`` (read with ``monotonic()``) and the blocking ``sleep`` are the real ones
    unless a test injects fakes."""

    clock: Clock = field(default_factory=SystemClock)
    sleep: Callable[[float], object] = time.sleep
    poll_s: float = 0.05

    def wait_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Poll ``done`` until it is true (True) or ``timeout`` seconds have passed on the clock (False)."""
        deadline = self.clock.monotonic() + timeout
        while not done():
            left = deadline - self.clock.monotonic()
            if left <= 0:
                return False
            self.sleep(min(self.poll_s, left))
        return True


REAL_TIME = Timer()


class Child:
    """One child process, leader of its own session and process group, writing to ``log_path``."""

    def __init__(self, popen: subprocess.Popen[bytes], log_path: Path, timer: Timer = REAL_TIME) -> None:
        self.popen = popen
        self.log_path = log_path
        self.timer = timer

    @classmethod
    def spawn(cls, argv: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None,
              cwd: Path | None = None, append: bool = True, header: str | None = None,
              parent_death_signal: int | None = None, timer: Timer = REAL_TIME) -> Child:
        """Start ``argv`` with stdout and stderr to ``log_path`` (appended to, or truncated with
        ``append=False``; a ``header`` line is written first) and stdin from /dev/null. ``env``: the child's
        whole environment (None: this process's). ``parent_death_signal``: sent to the child when the
        spawning thread dies (Linux; see :func:`die_with_parent`)."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        preexec = (lambda: die_with_parent(parent_death_signal)) if parent_death_signal is not None else None
        with open(log_path, "ab" if append else "wb") as log:  # the child keeps its own copy of the descriptor
            if header is not None:
                log.write(f"{header}\n".encode())
                log.flush()
            popen = subprocess.Popen(list(argv), env=dict(env) if env is not None else None, cwd=cwd,
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=preexec)
        return cls(popen, log_path, timer)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group, if the child still runs."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, sig)

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if the child still runs after ``timeout`` seconds (on the timer's clock)."""
        self.timer.wait_until(lambda: self.popen.poll() is not None, timeout)
        return self.popen.poll()

    def kill(self) -> int | None:
        """SIGKILL whatever is left of the group (the leader, or what it left behind) and reap the leader."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=KILL_WAIT_S)
        return self.popen.returncode

    def stop(self, grace: float) -> int | None:
        """SIGTERM the group; after ``grace`` seconds, SIGKILL what is left of it. Returns the exit code."""
        self.signal(signal.SIGTERM)
        self.wait(grace)
        return self.kill()

    def tail(self, lines: int = 25) -> str:
        return tail(self.log_path, lines)


def stop_all(children: Iterable[Child], grace: float, timer: Timer = REAL_TIME) -> dict[int, int | None]:
    """Stop several children within one grace period: SIGTERM all first, so they shut down in parallel, then
    SIGKILL those still running when it ends. Returns the exit code per pid."""
    group = list(children)
    for child in group:
        child.signal(signal.SIGTERM)
    timer.wait_until(lambda: not any(c.alive() for c in group), grace)
    return {child.pid: child.kill() for child in group}
