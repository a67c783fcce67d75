"""Start ``ajet server`` as a child process from a validated ``ServerConfig`` (handed over as a config file,
never as rebuilt argv), wait until it is healthy, and stop it. Used by ``ajet up``, the demo, the benchmarks
and the chaos suite."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from agentjet.settings import ServerConfig, write_config_file


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerExited(RuntimeError):
    """The server process ended before it became ready (or while it was expected to run)."""


class ServerProcess:
    def __init__(self, name: str, config: ServerConfig, log_path: Path, config_path: Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.config = config
        self.log_path = log_path
        self.config_path = config_path
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "agentjet.cli", "server", "--config", str(self.config_path)]

    def start(self) -> ServerProcess:
        write_config_file(self.config, self.config_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, env={**os.environ, **self.env})
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Until ``/health`` says ready. Raises ``ServerExited`` (with the log's tail) or ``TimeoutError``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
                raise ServerExited(f"server {self.name} exited with code {self.poll()}; see {self.log_path}:\n{tail}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).json().get("status") == "ready":
                    return
            except (httpx.TransportError, ValueError):
                pass
            time.sleep(0.3)
        raise TimeoutError(f"server {self.name} was not ready within {timeout:.0f}s; see {self.log_path}")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self, grace: float = 60.0) -> int | None:
        """SIGTERM (the server checkpoints and exits), then SIGKILL after ``grace`` seconds."""
        if self.proc is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()
        return self.proc.returncode
