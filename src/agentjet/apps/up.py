"""``ajet up swarm.yaml``: start a set of servers (and optionally clients) from one file, stop them cleanly.

    servers:
      planner:  {model: smollm2-135m-instruct, port: 10086, options: {group-size: 4, lr: 3e-5}}
      executor: {model: tiny-random, port: 10087, training: {batch_groups: 2}, env: {OMP_NUM_THREADS: "1"}}
    clients:
      team: {command: ["python", "examples/team_two_models.py", "--planner", "http://127.0.0.1:10086"]}
    log_dir: runs/up

A server entry is a ``ServerConfig`` (any setting, nested by section), plus ``options`` (settings by their
``ajet server`` flag, alias or dotted path) and ``env`` (extra environment). Every server is validated before
anything starts: a misspelt or out-of-range setting fails at once, naming the server and the field. Each
server gets its settings as a config file; each process logs to ``<log_dir>/<name>.log``. Servers start
first and are waited for (``/health``); Ctrl-C or SIGTERM stops the clients, then the servers (SIGTERM: they
checkpoint), then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentjet.runtime.launch import ServerProcess
from agentjet.runtime.proc import Child, Timer, stop_all
from agentjet.settings import ServerConfig, SettingsError, deep_merge, options_values, validate


class ClientSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)


class ServerSpec(BaseModel):
    """One server of a swarm file, validated."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    config: ServerConfig
    env: dict[str, str] = Field(default_factory=dict)


class SwarmSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    servers: dict[str, ServerSpec] = Field(min_length=1)
    clients: dict[str, ClientSpec] = Field(default_factory=dict)
    log_dir: Path = Path("runs/up")


def server_spec(name: str, raw: Any, log_dir: Path) -> ServerSpec:
    """A server entry -> its validated ``ServerConfig`` (data dir defaults to ``<log_dir>/<name>``)."""
    if not isinstance(raw, dict):
        raise SettingsError(f"servers.{name} must be a mapping of settings")
    raw = dict(raw)
    env = raw.pop("env", {}) or {}
    options = raw.pop("options", {}) or {}
    if not isinstance(options, dict) or not isinstance(env, dict):
        raise SettingsError(f"servers.{name}: options and env must be mappings")
    values = deep_merge(raw, options_values(options))
    values.setdefault("data_dir", str(log_dir / name))
    if values.get("port") in (None, 0):
        raise SettingsError("port: every server of a swarm file needs its own port (1-65535)")
    return ServerSpec(config=validate(values), env={str(k): str(v) for k, v in env.items()})


def load_spec(path: Path) -> SwarmSpec:
    """Read and validate a swarm file. Raises ``ValueError`` naming the server and the field."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{path} is not a valid swarm file: it must be a mapping with a 'servers' section")
    unknown = set(raw) - {"servers", "clients", "log_dir"}
    if unknown:
        raise ValueError(f"{path} is not a valid swarm file: unknown sections {sorted(unknown)}")
    log_dir = Path(raw.get("log_dir") or "runs/up")
    servers: dict[str, ServerSpec] = {}
    for name, entry in (raw.get("servers") or {}).items():
        try:
            servers[str(name)] = server_spec(str(name), entry, log_dir)
        except SettingsError as exc:
            raise ValueError(f"{path} is not a valid swarm file: server {name!r}:\n{exc}") from exc
    ports = [s.config.port for s in servers.values()]
    if len(set(ports)) != len(ports):
        raise ValueError(f"{path} is not a valid swarm file: two servers share a port ({sorted(ports)})")
    try:
        return SwarmSpec(servers=servers, clients=raw.get("clients") or {}, log_dir=log_dir)
    except ValidationError as exc:
        raise ValueError(f"{path} is not a valid swarm file:\n{exc}") from exc


class Swarm:
    def __init__(self, spec: SwarmSpec, echo: Any = print, timer: Timer | None = None) -> None:
        self.spec = spec
        self.log_dir = spec.log_dir
        self.echo = echo
        self.timer = timer or Timer()
        self.servers: dict[str, ServerProcess] = {}
        self.clients: dict[str, Child] = {}

    def _log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def start(self, timeout: float = 300) -> None:
        for name, spec in self.spec.servers.items():
            proc = ServerProcess(name, spec.config, self._log(name), self.log_dir / f"{name}.server.yaml", spec.env)
            self.servers[name] = proc.start()
            self.echo(f"started {name} (pid {proc.pid}), log {self._log(name)}")
        for name, proc in self.servers.items():
            proc.wait_ready(timeout)
            self.echo(f"{name} is ready at {proc.url}")
        for name, client in self.spec.clients.items():
            self.clients[name] = Child.spawn(client.command, self._log(name), env={**os.environ, **client.env},
                                             parent_death_signal=signal.SIGTERM)
            self.echo(f"started {name} (pid {self.clients[name].pid}), log {self._log(name)}")

    def wait(self) -> dict[str, int]:
        """Until every client has exited (or forever, with no clients), reporting exits. Returns the exit codes."""
        running = set(self.clients)
        codes: dict[str, int] = {}
        while True:
            for name in list(running):
                code = self.clients[name].poll()
                if code is not None:
                    self.echo(f"client {name} exited with code {code}")
                    codes[name] = code
                    running.discard(name)
            if self.clients and not running:
                return codes
            dead = [n for n, p in self.servers.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"server(s) {dead} exited unexpectedly; see their logs in {self.log_dir}")
            time.sleep(0.5)

    def stop(self, grace: float = 60) -> None:
        """The clients first, then the servers (they checkpoint on SIGTERM), all within one ``grace``."""
        deadline = self.timer.clock.monotonic() + grace
        self._stop_group(self.clients, grace)
        servers = {name: s.child for name, s in self.servers.items() if s.child is not None}
        self._stop_group(servers, max(0.1, deadline - self.timer.clock.monotonic()))

    def _stop_group(self, children: dict[str, Child], grace: float) -> None:
        codes = stop_all(children.values(), grace, self.timer)
        for name, child in children.items():
            self.echo(f"stopped {name} (code {codes[child.pid]})")
