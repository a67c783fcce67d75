"""A managed server subprocess: start, wait for health, watch, restart after a crash, stop.

Thread-based, so it works whatever event loop (or none) its owner runs on. The child runs in its own
process group (vLLM forks an engine-core process): stopping signals the whole group, SIGTERM then SIGKILL.
"""

from __future__ import annotations

import enum
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from agentjet.runtime.clock import Clock, SystemClock
from agentjet.runtime.proc import Child, tail

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0


class ProcessState(enum.StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"  # crashed; a new process is being started
    FAILED = "failed"  # could not be (re)started; no more attempts
    STOPPING = "stopping"


class ProcessStartError(RuntimeError):
    """The subprocess exited or did not become healthy in time."""


@dataclass(frozen=True)
class LaunchSpec:
    """What to run: computed afresh for every (re)start, so a restart picks up the latest weights."""

    argv: list[str]
    env: dict[str, str]
    health_url: str
    log_path: Path
    cwd: Path | None = None


@dataclass(frozen=True)
class Timing:
    startup_timeout_s: float = 600.0
    stop_timeout_s: float = 20.0
    max_restarts: int = 5
    restart_backoff_s: float = 2.0
    watch_interval_s: float = 0.5
    health_poll_s: float = 0.5

    def backoff(self, attempt: int) -> float:
        """Wait before restart number ``attempt`` (1-based): doubling, capped."""
        return min(self.restart_backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)


def http_healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class ProcessCounters:
    starts: int = 0
    crashes: int = 0
    restarts: int = 0
    last_exit_code: int | None = None
    last_start_seconds: float = 0.0
    crash_times: list[float] = field(default_factory=list)


class _Command(enum.Enum):
    START = "start"
    RESTART = "restart"
    STOP = "stop"


class ManagedProcess:
    """Owns one server subprocess at a time. ``launch`` is called for every start.

    One supervisor thread does every start, watch, restart and stop, so the child's parent-death signal
    (set per spawning *thread* on Linux) fires only when the supervisor, i.e. the owning process, is gone.
    """

    def __init__(
        self,
        launch: Callable[[], LaunchSpec],
        timing: Timing | None = None,
        *,
        healthy: Callable[[str], bool] = http_healthy,
        clock: Clock | None = None,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        """``clock`` and ``sleep`` time the health wait and the restart backoff (tests pass fakes); the
        default sleep wakes up early when the process is being stopped."""
        self._launch = launch
        self.timing = timing or Timing()
        self._healthy = healthy
        self._clock = clock or SystemClock()
        self._stopping = threading.Event()
        self._sleep = sleep or self._stopping.wait
        self._changed = threading.Condition()
        self._commands: queue.Queue[_Command] = queue.Queue()
        self._proc: Child | None = None
        self._state = ProcessState.STOPPED
        self._supervisor: threading.Thread | None = None
        self._done = 0  # commands finished (callers wait for their own)
        self._posted = 0
        self.counters = ProcessCounters()
        self.last_error: str | None = None

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> ProcessState:
        return self._state

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    def exit_code(self) -> int | None:
        """The current process's exit code if it has died (before the supervisor notices), else None."""
        proc = self._proc
        return proc.poll() if proc is not None else None

    def _set_state(self, state: ProcessState) -> None:
        with self._changed:
            self._state = state
            self._changed.notify_all()

    def wait_ready(self, timeout: float) -> bool:
        """Block until READY (True), or FAILED / STOPPED / the timeout (False)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._state is not ProcessState.READY:
                left = deadline - time.monotonic()
                if self._state in (ProcessState.FAILED, ProcessState.STOPPED) or left <= 0:
                    return False
                self._changed.wait(min(left, 1.0))
            return True

    # ------------------------------------------------------------------ public commands (any thread)
    def start(self) -> None:
        """Start the process and block until it answers its health URL (ProcessStartError if it cannot)."""
        self._run(_Command.START)

    def restart(self) -> None:
        """Stop and start again (e.g. to load other weights from disk); blocks until healthy."""
        self._run(_Command.RESTART)

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after ``stop_timeout_s``; ends the supervisor. Idempotent."""
        sup = self._supervisor
        if sup is None or not sup.is_alive():
            return
        self._stopping.set()
        with self._changed:
            self._posted += 1  # the supervisor counts STOP as done too: a later start waits for its own command
        self._commands.put(_Command.STOP)
        sup.join(timeout=self.timing.stop_timeout_s + self.timing.startup_timeout_s + 30)

    def _run(self, cmd: _Command) -> None:
        if self._supervisor is None or not self._supervisor.is_alive():
            self._stopping.clear()
            self._supervisor = threading.Thread(target=self._supervise, name="agentjet-vllm-supervisor",
                                                daemon=True)
            self._supervisor.start()
        with self._changed:
            self._posted += 1
            ticket = self._posted
        self._commands.put(cmd)
        with self._changed:
            while self._done < ticket:
                self._changed.wait(1.0)
            if self._state is not ProcessState.READY:
                raise ProcessStartError(self.last_error or f"the process is {self._state.value}")

    # ------------------------------------------------------------------ the supervisor thread
    def _supervise(self) -> None:
        while True:
            try:
                cmd = self._commands.get(timeout=self.timing.watch_interval_s)
            except queue.Empty:
                proc = self._proc
                if proc is not None and proc.poll() is not None and self._state is ProcessState.READY:
                    self.recover(proc.returncode)
                continue
            try:
                if cmd is _Command.STOP:
                    self._do_stop()
                    return
                if cmd is _Command.RESTART:
                    self._do_stop()
                self._do_start()
            finally:
                with self._changed:
                    self._done += 1
                    self._changed.notify_all()

    def _do_start(self) -> None:
        if self._state is ProcessState.READY:
            return
        self._set_state(ProcessState.STARTING)
        try:
            self._spawn_and_wait()
        except Exception as exc:  # noqa: BLE001 - reported to the caller through last_error and the state
            self.last_error = str(exc)
            log.error("start failed: %s", exc)
            self._set_state(ProcessState.FAILED)
            return
        self.last_error = None
        self._set_state(ProcessState.READY)

    def _do_stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            self._set_state(ProcessState.STOPPING)
            self._terminate(proc)
        self._set_state(ProcessState.STOPPED)

    def _spawn_and_wait(self) -> None:
        spec = self._launch()
        started = self._clock.monotonic()
        # a hard-killed server leaves no orphan vLLM behind: SIGTERM when the supervisor thread dies
        proc = Child.spawn(spec.argv, spec.log_path, env=spec.env, cwd=spec.cwd,
                           header=f"\n==> agentjet: starting {' '.join(spec.argv)}", parent_death_signal=signal.SIGTERM)
        self._proc = proc
        self.counters.starts += 1
        log.info("started %s (pid %d); waiting for %s", spec.argv[0], proc.pid, spec.health_url)
        deadline = started + self.timing.startup_timeout_s
        while True:
            code = proc.poll()
            if code is not None:
                self.counters.last_exit_code = code
                proc.kill()
                raise ProcessStartError(f"the process exited with code {code} while starting; last lines of "
                                        f"{spec.log_path}:\n{tail(spec.log_path)}")
            if self._stopping.is_set():
                self._terminate(proc)
                raise ProcessStartError("stopped while starting")
            if self._healthy(spec.health_url):
                break
            if self._clock.monotonic() >= deadline:
                self._terminate(proc)
                raise ProcessStartError(f"no healthy answer from {spec.health_url} within "
                                        f"{self.timing.startup_timeout_s:.0f}s; last lines of {spec.log_path}:\n"
                                        f"{tail(spec.log_path)}")
            self._sleep(self.timing.health_poll_s)
        self.counters.last_start_seconds = self._clock.monotonic() - started
        log.info("pid %d healthy after %.1fs", proc.pid, self.counters.last_start_seconds)

    def _terminate(self, proc: Child) -> None:
        if proc.stop(self.timing.stop_timeout_s) == -signal.SIGKILL:
            log.warning("pid %d ignored SIGTERM for %.0fs; killed it", proc.pid, self.timing.stop_timeout_s)

    def recover(self, exit_code: int | None) -> None:
        """The process died: clean up its group, then restart with backoff until it is healthy or
        ``max_restarts`` restarts have been used up (then FAILED). Runs on the supervisor thread."""
        proc = self._proc
        self.counters.crashes += 1
        self.counters.crash_times.append(self._clock.monotonic())
        self.counters.last_exit_code = exit_code
        self._set_state(ProcessState.RESTARTING)
        log.error("the managed process (pid %s) exited unexpectedly with code %s; restarting",
                  proc.pid if proc else None, exit_code)
        if proc is not None:
            proc.kill()
        while not self._stopping.is_set():
            if self.counters.restarts >= self.timing.max_restarts:
                self.last_error = f"gave up after {self.counters.restarts} restarts (last exit code {exit_code})"
                log.error("the managed process %s", self.last_error)
                self._set_state(ProcessState.FAILED)
                return
            self.counters.restarts += 1
            self._sleep(self.timing.backoff(self.counters.restarts))
            if self._stopping.is_set():
                return
            try:
                self._spawn_and_wait()
            except ProcessStartError as exc:
                self.last_error = str(exc)
                log.error("restart %d failed: %s", self.counters.restarts, exc)
                continue
            self.last_error = None
            self._set_state(ProcessState.READY)
            return

