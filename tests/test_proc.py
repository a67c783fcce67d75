"""The one process supervisor (agentjet.runtime.proc): a child in its own session logging to a file, SIGTERM then SIGKILL
after a grace period on a fake clock, one grace period for several children, the parent-death signal."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from agentjet.runtime.clock import FakeClock
from agentjet.runtime.proc import Child, Timer, free_port, stop_all, tail

IGNORE_TERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
               "time.sleep(120)")
SLEEP = "import time; print('ready', flush=True); time.sleep(120)"


def fake_timer() -> tuple[Timer, FakeClock]:
    """Grace periods on a fake clock. Each poll also yields 20 ms of real time, so a child that obeys SIGTERM
    has been seen to exit (by the kernel) before a short grace period of fake time runs out."""
    clock = FakeClock()

    def sleep(seconds: float) -> None:
        clock.advance(seconds)
        time.sleep(0.02)

    return Timer(clock=clock, sleep=sleep, poll_s=5), clock


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def wait_ready(child: Child) -> None:
    """Until the child has printed 'ready' (its signal handler is in place): an event, not a sleep."""
    assert Timer().wait_until(lambda: "ready" in tail(child.log_path), 30), tail(child.log_path)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_child_runs_in_its_own_session_and_logs_to_its_file(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "child.log"
    log.parent.mkdir()
    log.write_text("earlier run\n")
    child = Child.spawn(python("import os; print('sid', os.getsid(0), 'pid', os.getpid())"), log,
                        env={**os.environ, "X": "1"}, header="==> starting")
    assert child.wait(30) == 0
    assert os.getpgid(os.getpid()) != child.pid
    lines = log.read_text().splitlines()
    assert lines == ["earlier run", "==> starting", f"sid {child.pid} pid {child.pid}"]  # appended, own session


def test_append_false_truncates_and_env_is_the_whole_environment(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text("stale\n")
    child = Child.spawn(python("import os; print(sorted(k for k in os.environ if k.startswith('AJ_T')))"), log,
                        env={"AJ_T1": "x", "PATH": os.environ.get("PATH", "")}, append=False)
    assert child.wait(30) == 0
    assert log.read_text() == "['AJ_T1']\n"


def test_stop_is_sigterm_when_the_child_obeys(tmp_path: Path) -> None:
    timer, clock = fake_timer()
    child = Child.spawn(python(SLEEP), tmp_path / "c.log", timer=timer)
    wait_ready(child)
    assert child.stop(grace=60) == -signal.SIGTERM
    assert clock.now < 1000 + 60  # it did not need the whole grace period


def test_stop_sigkills_after_the_grace_period_on_the_fake_clock(tmp_path: Path) -> None:
    timer, clock = fake_timer()
    child = Child.spawn(python(IGNORE_TERM), tmp_path / "c.log", timer=timer)
    wait_ready(child)
    started = time.monotonic()
    assert child.stop(grace=300) == -signal.SIGKILL
    assert clock.now >= 1000 + 300  # the whole grace period passed, on the fake clock
    assert time.monotonic() - started < 30  # ... not in real time
    assert not alive(child.pid)


def test_signals_reach_the_whole_group(tmp_path: Path) -> None:
    grandchild_pid = tmp_path / "grandchild.pid"
    code = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {IGNORE_TERM!r}]); "
            f"open({str(grandchild_pid)!r}, 'w').write(str(p.pid)); print('ready', flush=True); time.sleep(120)")
    timer, _ = fake_timer()
    child = Child.spawn(python(code), tmp_path / "c.log", timer=timer)
    assert Timer().wait_until(lambda: grandchild_pid.exists() and grandchild_pid.read_text() != "" and
                              tail(child.log_path).count("ready") == 2, 30), tail(child.log_path)
    gpid = int(grandchild_pid.read_text())
    assert child.stop(grace=30) == -signal.SIGTERM
    assert Timer().wait_until(lambda: not alive(gpid) or _zombie(gpid), 30)  # the SIGKILL reached it too


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def test_stop_all_shares_one_grace_period(tmp_path: Path) -> None:
    timer, clock = fake_timer()
    stubborn = [Child.spawn(python(IGNORE_TERM), tmp_path / f"s{i}.log", timer=timer) for i in range(2)]
    polite = Child.spawn(python(SLEEP), tmp_path / "p.log", timer=timer)
    for c in [*stubborn, polite]:
        wait_ready(c)
    codes = stop_all([*stubborn, polite], grace=100, timer=timer)
    assert codes == {stubborn[0].pid: -signal.SIGKILL, stubborn[1].pid: -signal.SIGKILL,
                     polite.pid: -signal.SIGTERM}
    assert 1000 + 100 <= clock.now < 1000 + 101  # one grace period for all, not one each


def test_wait_until_polls_on_the_timer() -> None:
    timer, clock = fake_timer()
    assert timer.wait_until(lambda: clock.now >= 1003, 10)
    assert clock.now == 1005
    assert not timer.wait_until(lambda: False, 12)
    assert clock.now == 1017  # the last sleep is cut to the deadline


def test_the_parent_death_signal_fires_when_the_spawning_thread_ends(tmp_path: Path) -> None:
    spawned: list[Child] = []
    plain: list[Child] = []

    def spawn() -> None:
        spawned.append(Child.spawn(python(SLEEP), tmp_path / "a.log", parent_death_signal=signal.SIGTERM))
        plain.append(Child.spawn(python(SLEEP), tmp_path / "b.log"))

    thread = threading.Thread(target=spawn)
    thread.start()
    thread.join()
    assert spawned[0].wait(30) == -signal.SIGTERM  # its parent thread is gone
    assert plain[0].wait(0.5) is None  # the one without it lives on
    assert plain[0].stop(grace=10) == -signal.SIGTERM


def test_tail_of_a_missing_log(tmp_path: Path) -> None:
    assert tail(tmp_path / "nope.log") == "(no log)"
    (tmp_path / "l.log").write_text("\n".join(str(i) for i in range(100)))
    assert tail(tmp_path / "l.log", 3) == "97\n98\n99"


def test_a_server_process_dies_with_the_thread_that_started_it(tmp_path: Path, tiny_model_path: Path) -> None:
    """A server started by a demo, a benchmark or ``ajet up`` does not outlive its owner: one whose owner was
    killed kept its port and a CPU busy (an orphaned benchmark server was found running)."""
    from agentjet.runtime.launch import ServerProcess
    from agentjet.settings import GeneratorSettings, ServerConfig

    config = ServerConfig(model=str(tiny_model_path), port=free_port(), data_dir=tmp_path / "data",
                          generator=GeneratorSettings(kind="null"))
    started: list[ServerProcess] = []
    ready: list[bool] = []

    def own() -> None:  # the owner: starts the server, sees it ready, ends
        started.append(ServerProcess("s", config, tmp_path / "s.log", tmp_path / "s.yaml").start())
        started[0].wait_ready(120)
        ready.append(True)

    thread = threading.Thread(target=own)
    thread.start()
    thread.join()
    child = started[0].child
    assert child is not None and child.wait(60) is not None, "the server outlived its owner"
    assert ready and child.returncode in (0, -signal.SIGTERM), child.tail()


def test_one_clock_shape() -> None:
    """Everything that reads time takes the one ``agentjet.runtime.clock.Clock`` (a FakeClock in tests), not a
    bare ``Callable[[], float]``."""
    from pathlib import Path

    import agentjet

    src = Path(agentjet.__file__).parent
    bare = [f"{p.relative_to(src)}:{i}" for p in src.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if "Callable[[], float]" in line or "= time.monotonic," in line or "= time.monotonic)" in line]
    assert bare == []


def test_wait_ready_does_not_take_another_process_on_its_port_for_its_server(make_server, tmp_path: Path) -> None:
    """Free ports are picked before the child binds: if another server takes the port first, the launcher must
    not take that one's /health for its own (it did: a demo then talked to another test's server); its own child
    fails to bind and exits, and wait_ready says so."""
    from agentjet.runtime.launch import ServerExited, ServerProcess
    from agentjet.settings import ServerConfig

    thief = make_server()  # an in-process server, ready, on a port the child is told to use
    port = int(thief.url.rsplit(":", 1)[1])
    child = ServerProcess("late", ServerConfig(model="tiny-random", port=port, data_dir=tmp_path / "late",
                                               generator={"kind": "null"}),
                          tmp_path / "late.log", tmp_path / "late.yaml").start()
    try:
        with pytest.raises(ServerExited, match="exited"):
            child.wait_ready(timeout=120)
    finally:
        child.stop(grace=5)


def test_start_ready_picks_another_port_when_its_first_was_taken(make_server, tmp_path: Path) -> None:
    from agentjet.runtime.launch import ServerProcess, start_ready
    from agentjet.settings import ServerConfig

    thief = make_server()
    taken = int(thief.url.rsplit(":", 1)[1])
    ports = iter([taken])  # the first pick is taken; the next is a fresh free port

    def make(port: int) -> ServerProcess:
        port = next(ports, port)
        return ServerProcess(f"s{port}", ServerConfig(model="tiny-random", port=port, data_dir=tmp_path / str(port),
                                                      generator={"kind": "null"}),
                             tmp_path / f"{port}.log", tmp_path / f"{port}.yaml")

    server = start_ready(make, timeout=120)
    try:
        assert server.config.port != taken and server.poll() is None
    finally:
        server.stop(grace=10)


def test_the_server_process_takes_its_gil_switch_interval_from_the_settings(tmp_path: Path) -> None:
    import httpx

    from agentjet.runtime.launch import ServerProcess, start_ready
    from agentjet.settings import ServerConfig

    def make(port: int) -> ServerProcess:
        config = ServerConfig(model="tiny-random", port=port, data_dir=tmp_path / "data",
                              generator={"gil_switch_interval_ms": 1.5})
        return ServerProcess("gil", config, tmp_path / "server.log", tmp_path / "server.yaml")

    server = start_ready(make, timeout=120)
    try:
        info = httpx.get(f"{server.url}/swarm/v1/status", timeout=30).json()["engine_info"]
        assert info["gil_switch_interval_ms"] == 1.5  # Python's default is 5
    finally:
        server.stop(grace=10)
