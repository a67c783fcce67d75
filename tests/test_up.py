"""`ajet up`: servers from one file, a client, clean stop; clear errors for bad files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from agentjet.server.app import free_port
from agentjet.up import load_spec, server_command


def test_server_command_maps_options(tmp_path: Path) -> None:
    spec = load_spec(_write(tmp_path, "servers:\n  a: {model: tiny-random, port: 1234, options: {lr: 3.0e-5, "
                                      "group_size: 8, resume: true}}\n"))
    cmd = server_command("a", spec.servers["a"], tmp_path)
    assert cmd[cmd.index("--port") + 1] == "1234" and cmd[cmd.index("--lr") + 1] == "3e-05"
    assert "--group-size" in cmd and "--resume" in cmd


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "swarm.yaml"
    p.write_text(text)
    return p


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
