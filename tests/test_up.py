"""`ajet up`: servers from one file, a client, clean stop; clear errors for bad files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentjet.apps.up import load_spec
from agentjet.runtime.launch import free_port


def test_server_entries_are_validated_settings(tmp_path: Path) -> None:
    spec = load_spec(_write(tmp_path, "servers:\n  a: {model: tiny-random, port: 1234, options: {lr: 3.0e-5, "
                                      "group_size: 8, resume: true}, loss: {kl_coef: 0.1}, env: {X: 1}}\n"
                                      "log_dir: logs\n"))
    a = spec.servers["a"]
    assert a.config.port == 1234 and a.config.learner.learning_rate == 3e-5 and a.config.training.group_size == 8
    assert a.config.resume and a.config.loss.kl_coef == 0.1 and a.env == {"X": "1"}
    assert a.config.data_dir == Path("logs/a")


@pytest.mark.parametrize(("entry", "message"), [
    ("{port: 1234, options: {group-siz: 8}}", "unknown setting 'group-siz'; did you mean group-size"),
    ("{port: 1234, options: {lr: 5}}", "learner.learning_rate (--learning-rate): Input should be less than 1"),
    ("{port: 1234, training: {batch_groupz: 2}}", "training.batch_groupz"),
    ("{port: 1234, placement: {device: tpu}}", "placement.device (--device)"),
    ("{port: 1234, engine: {device: cuda}}", "engine.device moved to placement.device"),
    ("{port: 1234, trainer: {procs: 2}}", "trainer.procs moved to learner.group.procs"),
    ("{port: 1234, options: {training.learning_rate: 1.0e-5}}", "training.learning_rate moved to learner.learning_rate"),
    ("{port: 1234, options: {train-nnodes: 2}}", "--train-nnodes moved to --learner-nnodes"),
    ("{options: {lr: 1.0e-5}}", "needs its own port"),
])
def test_bad_server_entry_fails_before_anything_starts(tmp_path: Path, entry: str, message: str) -> None:
    p = _write(tmp_path, f"servers:\n  planner: {entry}\nlog_dir: {tmp_path / 'logs'}\n")
    out = subprocess.run([sys.executable, "-m", "agentjet.cli", "up", str(p)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "COLUMNS": "250"})
    text = " ".join(out.stdout.split())
    assert out.returncode == 2 and "server 'planner'" in text and message in text, out.stdout + out.stderr
    assert not (tmp_path / "logs").exists()  # nothing was spawned


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "swarm.yaml"
    p.write_text(text)
    return p


@pytest.mark.server
def test_up_starts_servers_and_client_then_stops(tmp_path: Path, tiny_model_path: Path) -> None:
    pa, pb = free_port(), free_port()
    marker = tmp_path / "client-ran"
    spec = _write(tmp_path, f"""
servers:
  planner: {{model: {tiny_model_path}, port: {pa}, options: {{engine: "null"}}}}
  executor: {{model: {tiny_model_path}, port: {pb}, options: {{engine: "null"}}}}
clients:
  probe:
    command: ["{sys.executable}", "-c", "import httpx, pathlib; assert httpx.get('http://127.0.0.1:{pb}/health').json()['status'] == 'ready'; pathlib.Path('{marker}').write_text('ok'); import time; time.sleep(60)"]
log_dir: {tmp_path / "logs"}
""")
    proc = subprocess.Popen([sys.executable, "-m", "agentjet.cli", "up", str(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline
            time.sleep(0.3)
        for port in (pa, pb):
            assert httpx.get(f"http://127.0.0.1:{port}/health").json()["status"] == "ready"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=120)[0]
    assert "stopped planner" in out and "stopped executor" in out and "stopped probe" in out
    for port in (pa, pb):
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            raise AssertionError("server still up")
        except httpx.TransportError:
            pass
    assert (tmp_path / "logs" / "planner.log").read_text()


def test_bad_swarm_file_is_a_clear_error(tmp_path: Path) -> None:
    p = _write(tmp_path, "servers:\n  a: {port: 'not a port'}\n")
    out = subprocess.run([sys.executable, "-m", "agentjet.cli", "up", str(p)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "not a valid swarm file" in out.stdout and "port" in out.stdout


@pytest.mark.server
def test_up_exits_non_zero_when_a_client_fails(tmp_path: Path, tiny_model_path: Path) -> None:
    spec = _write(tmp_path, f"""
servers:
  a: {{model: {tiny_model_path}, port: {free_port()}, options: {{engine: "null"}}}}
clients:
  bad: {{command: ["{sys.executable}", "-c", "raise SystemExit(3)"]}}
log_dir: {tmp_path / "logs"}
""")
    out = subprocess.run([sys.executable, "-m", "agentjet.cli", "up", str(spec)], capture_output=True, text=True,
                         timeout=180, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 1 and "client bad exited with code 3" in out.stdout and "failed" in out.stdout


@pytest.mark.server
def test_a_nested_secret_reaches_the_server_that_up_starts(tmp_path: Path, tiny_model_path: Path) -> None:
    """`ajet up` hands each server its settings as a file: a nested read token must arrive as itself, so the
    real token opens /metrics and pydantic's mask does not."""
    port = free_port()
    spec = _write(tmp_path, f"""
servers:
  a: {{model: {tiny_model_path}, port: {port}, observe: {{read_token: "r34l-read-t0ken"}}, options: {{engine: "null"}}}}
log_dir: {tmp_path / "logs"}
""")
    proc = subprocess.Popen([sys.executable, "-m", "agentjet.cli", "up", str(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "the server did not come up"
            try:
                if httpx.get(f"{url}/health", timeout=2).json().get("status") == "ready":
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        real = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer r34l-read-t0ken"}, timeout=10)
        mask = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer **********"}, timeout=10)
        assert real.status_code == 200 and "agentjet" in real.text
        assert mask.status_code == 401
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=120)
