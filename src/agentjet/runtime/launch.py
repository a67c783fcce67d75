"""Start ``ajet server`` as a child process from a validated ``ServerConfig`` (handed over as a config file,
never as rebuilt argv), wait until it is healthy, and stop it. Used by ``ajet up``, the demo, the benchmarks
and the chaos suite."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx

from agentjet.runtime.proc import Child, free_port
from agentjet.settings import ServerConfig, write_config_file

__all__ = ["ServerExited", "ServerProcess", "free_port", "start_ready"]


log = logging.getLogger(__name__)


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
        self.child: Child | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "agentjet.cli", "server", "--config", str(self.config_path)]

    def start(self) -> ServerProcess:
        write_config_file(self.config, self.config_path)
        # The server dies with its owner (a demo, a benchmark, ``ajet up``) even when the owner is killed hard:
        # an orphaned server kept its port and a CPU busy. Start it from a thread that lives as long as it does.
        self.child = Child.spawn(self.command(), self.log_path, env={**os.environ, **self.env},
                                 parent_death_signal=signal.SIGTERM)
        return self

    @property
    def pid(self) -> int:
        assert self.child is not None, "not started"
        return self.child.pid

    def poll(self) -> int | None:
        return self.child.poll() if self.child is not None else None

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Until ``/health`` says ready from this server's own process (another process that took the port
        first does not count: this one then fails to bind and exits). Raises ``ServerExited`` (with the log's
        tail) or ``TimeoutError``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.poll() is not None:
                tail = self.child.tail() if self.child is not None else ""
                raise ServerExited(f"server {self.name} exited with code {self.poll()}; see {self.log_path}:\n{tail}")
            try:
                health = httpx.get(f"{self.url}/health", timeout=2).json()
                if health.get("status") == "ready" and health.get("pid") == self.pid:
                    return
            except (httpx.TransportError, ValueError):
                pass
            time.sleep(0.3)
        raise TimeoutError(f"server {self.name} was not ready within {timeout:.0f}s; see {self.log_path}")

    def signal(self, sig: int) -> None:
        if self.child is not None:
            self.child.signal(sig)

    def stop(self, grace: float = 60.0) -> int | None:
        """SIGTERM (the server checkpoints and exits), then SIGKILL after ``grace`` seconds."""
        return self.child.stop(grace) if self.child is not None else None


PORT_TAKEN = "address already in use"


def start_ready(make: Callable[[int], ServerProcess], port: int | None = None, attempts: int = 3,
                timeout: float = 300.0) -> ServerProcess:
    """Start the server ``make(port)`` builds and wait until it is ready. Without a given ``port``, a free one is
    picked, and picked again when another process took it before the child could bind (the child then exits
    saying so): up to ``attempts`` times."""
    for attempt in range(1, attempts + 1):
        server = make(port or free_port()).start()
        try:
            server.wait_ready(timeout)
            return server
        except ServerExited as exc:
            server.stop(grace=5)
            if port is not None or attempt == attempts or PORT_TAKEN not in str(exc).lower():
                raise
            log.warning("the port of server %s was taken before it could bind; trying another", server.name)
        except BaseException:
            server.stop(grace=5)
            raise
    raise AssertionError("unreachable")
