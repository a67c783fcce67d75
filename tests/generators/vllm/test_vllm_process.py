"""The managed subprocess: health wait and its timeout (fake clock), restart backoff and giving up, SIGTERM then
SIGKILL on stop."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from agentjet.generators.vllm.process import (
    LaunchSpec,
    ManagedProcess,
    ProcessStartError,
    ProcessState,
    Timing,
)
from agentjet.runtime.clock import FakeClock


class SleepingClock(FakeClock):
    """The fake clock, with the blocking sleep the supervisor is given: it moves the clock and is recorded."""

    def __init__(self) -> None:
        super().__init__(start=0.0)
        self.sleeps: list[float] = []

    def sleep_blocking(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)


def spec(tmp_path: Path, code: str) -> LaunchSpec:
    return LaunchSpec(argv=[sys.executable, "-c", code], env=dict(os.environ), health_url="http://unused/health",
                      log_path=tmp_path / "proc.log")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_start_times_out_on_the_fake_clock_and_kills_the_process(tmp_path):
    clock = SleepingClock()
    proc = ManagedProcess(lambda: spec(tmp_path, "import time; time.sleep(60)"),
                          Timing(startup_timeout_s=30, health_poll_s=0.5, stop_timeout_s=5),
                          healthy=lambda url: False, clock=clock, sleep=clock.sleep_blocking)
    with pytest.raises(ProcessStartError, match="within 30s"):
        proc.start()
    assert proc.state is ProcessState.FAILED
    assert clock.now >= 30 and len(clock.sleeps) == 60  # polled every 0.5 s of fake time, no real waiting
    assert proc.pid is not None and not alive(proc.pid)
    proc.stop()


def test_a_process_that_exits_while_starting_reports_its_log(tmp_path):
    proc = ManagedProcess(lambda: spec(tmp_path, "print('boom: no model here'); raise SystemExit(3)"),
                          healthy=lambda url: False)
    with pytest.raises(ProcessStartError, match="code 3") as err:
        proc.start()
    assert "boom: no model here" in str(err.value)
    proc.stop()


def test_restarts_back_off_then_give_up(tmp_path):
    clock = SleepingClock()
    starts: list[int] = []

    def launch() -> LaunchSpec:
        starts.append(1)
        return spec(tmp_path, "raise SystemExit(1)")  # every restart fails at once

    proc = ManagedProcess(launch, Timing(max_restarts=3, restart_backoff_s=2.0, health_poll_s=0.25),
                          healthy=lambda url: False, clock=clock, sleep=clock.sleep_blocking)
    proc.recover(exit_code=-9)
    assert proc.state is ProcessState.FAILED
    assert [s for s in clock.sleeps if s != 0.25] == [2.0, 4.0, 8.0]  # doubling backoff between restarts
    assert len(starts) == 3 and proc.counters.restarts == 3 and proc.counters.crashes == 1
    assert "gave up after 3 restarts" in (proc.last_error or "")


def test_watcher_restarts_a_crashed_process(tmp_path):
    proc = ManagedProcess(lambda: spec(tmp_path, "import time; time.sleep(60)"),
                          Timing(watch_interval_s=0.05, restart_backoff_s=0.0), healthy=lambda url: True)
    proc.start()
    first = proc.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while proc.counters.restarts < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.wait_ready(30)
    assert proc.pid != first and proc.counters.crashes == 1 and proc.counters.last_exit_code == -signal.SIGKILL
    proc.stop()
    assert proc.state is ProcessState.STOPPED


def test_stop_escalates_to_sigkill(tmp_path):
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    proc = ManagedProcess(lambda: spec(tmp_path, code), Timing(stop_timeout_s=0.5), healthy=lambda url: True)
    proc.start()
    pid = proc.pid
    assert pid is not None
    t0 = time.monotonic()
    proc.stop()
    assert not alive(pid) and time.monotonic() - t0 < 10
    assert "ignored SIGTERM" not in (tmp_path / "proc.log").read_text()  # the warning goes to our log, not its
    assert proc.state is ProcessState.STOPPED


def test_a_stopped_process_starts_again(tmp_path):
    """Stop, then start the same supervisor again (a fleet restarts a replica's vLLM so): the start waits for its
    own command, not for the stop's (it used to return at once, the process still stopped)."""
    proc = ManagedProcess(lambda: spec(tmp_path, "import time; time.sleep(60)"), Timing(stop_timeout_s=2.0),
                          healthy=lambda url: True)
    proc.start()
    first = proc.pid
    proc.stop()
    assert proc.state is ProcessState.STOPPED and not alive(first)
    proc.start()
    assert proc.state is ProcessState.READY and proc.pid != first and alive(proc.pid)
    proc.stop()
    assert proc.state is ProcessState.STOPPED
