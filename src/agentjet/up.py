"""``ajet up swarm.yaml``: start a set of servers (and optionally clients) from one file, stop them cleanly.

    servers:
      planner:  {model: smollm2-135m-instruct, port: 10086, options: {group-size: 4, lr: 3e-5}}
      executor: {model: tiny-random, port: 10087}
    clients:
      team: {command: ["python", "examples/team_workflow.py", "--planner", "http://127.0.0.1:10086"]}
    log_dir: runs/up

Each process logs to ``<log_dir>/<name>.log``; servers are started first and waited for (``/health``).
Ctrl-C or SIGTERM stops the clients, then the servers (SIGTERM: they checkpoint), then SIGKILL after
a grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ServerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = "smollm2-135m-instruct"
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    data_dir: str | None = None
    options: dict[str, Any] = Field(default_factory=dict, description="more `ajet server` options, e.g. lr: 3e-5")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment, e.g. OMP_NUM_THREADS: '1'")


class ClientSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)


class SwarmSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    servers: dict[str, ServerSpec] = Field(min_length=1)
    clients: dict[str, ClientSpec] = Field(default_factory=dict)
    log_dir: str = "runs/up"


def load_spec(path: Path) -> SwarmSpec:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    try:
        return SwarmSpec.model_validate(raw or {})
    except ValidationError as exc:
        raise ValueError(f"{path} is not a valid swarm file:\n{exc}") from exc


def server_command(name: str, spec: ServerSpec, log_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "agentjet.cli", "server", "--model", spec.model, "--host", spec.host,
           "--port", str(spec.port), "--data-dir", spec.data_dir or str(log_dir / name)]
    for key, value in spec.options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            cmd.append(flag if value else f"--no-{flag[2:]}")
        else:
            cmd += [flag, str(value)]
    return cmd


class Swarm:
    def __init__(self, spec: SwarmSpec, echo: Any = print) -> None:
        self.spec = spec
        self.log_dir = Path(spec.log_dir)
        self.echo = echo
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child process
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**os.environ, **(env or {})})
        self.echo(f"started {name} (pid {self.procs[name].pid}), log {self.log_dir / f'{name}.log'}")

    def start(self, timeout: float = 300) -> None:
        for name, spec in self.spec.servers.items():
            self._spawn(name, server_command(name, spec, self.log_dir), spec.env)
        for name, spec in self.spec.servers.items():
            self._wait_healthy(name, f"http://{spec.host}:{spec.port}", timeout)
        for name, spec in self.spec.clients.items():
            self._spawn(name, spec.command, spec.env)

    def _wait_healthy(self, name: str, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"server {name} exited with code {self.procs[name].returncode}; see "
                                   f"{self.log_dir / f'{name}.log'}")
            try:
                if httpx.get(f"{url}/health", timeout=2).json().get("status") == "ready":
                    self.echo(f"{name} is ready at {url}")
                    return
            except (httpx.TransportError, ValueError):
                pass
            time.sleep(0.3)
        raise RuntimeError(f"server {name} was not ready within {timeout:.0f}s")

    def wait(self) -> None:
        """Until every client has exited (or forever, with no clients), reporting exits."""
        clients = set(self.spec.clients)
        while True:
            for name in list(clients):
                code = self.procs[name].poll()
                if code is not None:
                    self.echo(f"client {name} exited with code {code}")
                    clients.discard(name)
            if self.spec.clients and not clients:
                return
            dead = [n for n in self.spec.servers if self.procs[n].poll() is not None]
            if dead:
                raise RuntimeError(f"server(s) {dead} exited unexpectedly; see their logs in {self.log_dir}")
            time.sleep(0.5)

    def stop(self, grace: float = 60) -> None:
        order = [n for n in self.spec.clients if n in self.procs] + [n for n in self.spec.servers if n in self.procs]
        for name in order:
            proc = self.procs[name]
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name in order:
            proc = self.procs[name]
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            self.echo(f"stopped {name} (code {proc.returncode})")
