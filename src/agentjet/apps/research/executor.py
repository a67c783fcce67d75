"""Where a study's runs execute: one small interface, two executors.

The study (:mod:`agentjet.apps.research.study`) asks its executor to launch an attempt of a run from the study's
:class:`TrialTemplate`, or to attach to an attempt of an earlier session, and gets a handle. Each poll of a handle is one :class:`Look`: the server's
status, whether the attempt's processes are alive, the client's result, and two states only a cluster has
(``waiting``: not placed yet; ``lost``: the node that ran it is gone). The loop has one copy; only this
interface differs between:

- :class:`LocalExecutor`: `ajet up` as a child process of this machine, watched over loopback HTTP (the
  default);
- ``RayExecutor`` (:mod:`agentjet.apps.research.ray_executor`): `ajet up` inside a Ray actor on some node of a
  cluster (``ajet research --ray ADDRESS``); its files come back into the attempt directory through
  :class:`FileSync` and :func:`apply_chunks`.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from agentjet.apps.research.monitor import TrialResult, parse_status, read_result
from agentjet.apps.research.process import TrialProcess
from agentjet.apps.research.spec import (
    RaySettings,
    StudySpec,
    SwarmTemplate,
    TrialClientSettings,
    split_params,
)
from agentjet.apps.research.state import Attempt, TrialRecord
from agentjet.apps.up import ClientSpec
from agentjet.protocol import SWARM_PREFIX, ServerStatus
from agentjet.runtime.launch import free_port


@dataclass
class Look:
    """One poll of an attempt."""

    status: ServerStatus | None = None  # the watched server's status answer (None: no answer)
    alive: bool = True  # `ajet up` runs
    result: TrialResult | None = None  # the client's result.json, once written
    waiting: str | None = None  # not started yet (a cluster waits for the resources): no clock runs
    lost: str | None = None  # the node that ran it is gone: retried elsewhere, not counted as a crash


class TrialHandle(Protocol):
    def poll(self) -> Look: ...

    def record(self, attempt: Attempt) -> bool:
        """Write what is known of the attempt (pid, start time, port, node, children) into its record; True
        when something changed."""
        ...

    def stop(self, grace_s: float, keep_checkpoints: bool) -> None:
        """Stop the attempt's processes (SIGTERM, then SIGKILL after ``grace_s``); its files stay in the
        attempt directory, its server checkpoints only with ``keep_checkpoints``."""
        ...


class TrialExecutor(Protocol):
    name: str  # "local" or "ray"

    def check(self, template: TrialTemplate) -> None:
        """Refuse a study that can never run here (StudySpecError): a trial no node of the cluster holds."""
        ...

    def launch(self, template: TrialTemplate, run: TrialRecord, attempt: Attempt, attempt_dir: Path) -> TrialHandle:
        """Start a new attempt (its record gets the executor's fields: pid, port, or the Ray actor's name)."""
        ...

    def attach(self, template: TrialTemplate, run: TrialRecord, attempt: Attempt, attempt_dir: Path) -> TrialHandle:
        """The attempt of an earlier session, alive or not (its ``poll`` says which)."""
        ...

    def close(self) -> None: ...


class TrialTemplate(BaseModel):
    """What every attempt of one study starts from, derived from its spec once: the `ajet up` template, the watched
    server, the built-in trial client's settings (None when the base names clients of its own) and what one trial
    reserves on a cluster. An executor sees only this (on a Ray cluster it travels to the node whole)."""

    model_config = ConfigDict(frozen=True)
    base: SwarmTemplate
    primary: str
    client: TrialClientSettings | None
    ray: RaySettings

    @classmethod
    def of(cls, spec: StudySpec) -> TrialTemplate:
        return cls(base=spec.base, primary=spec.primary, client=None if spec.base.clients else spec.client,
                   ray=spec.ray)

    def url(self, port: int) -> str:
        """The watched server's URL on ``port``."""
        return f"http://{self.base.host(self.primary)}:{port}"

    def swarm(self, run: TrialRecord, attempt_dir: Path, ports: dict[str, int]) -> dict[str, Any]:
        """The `ajet up` spec of one attempt: the base spec on fresh ports and data dirs, the run's server
        settings on the primary server, and the built-in trial client unless the base names clients."""
        server_params, client_params = split_params(run.params)
        base = self.base
        servers = {}
        for name, raw in base.servers.items():
            options = {**base.options(name), **(server_params if name == self.primary else {})}
            servers[name] = {**raw, "port": ports[name], "data_dir": str(attempt_dir / f"server-{name}"),
                             "options": options, "admin_token": raw.get("admin_token") or secrets.token_urlsafe(32)}
        admin = {"AGENTJET_ADMIN_TOKEN": str(servers[self.primary]["admin_token"])}  # the client pauses for evals
        url = self.url(ports[self.primary])
        if base.clients:
            marks = {"{server_url}": url, "{trial_dir}": str(attempt_dir), "{seed}": str(run.seed),
                     **{f"{{url:{n}}}": f"http://{base.host(n)}:{ports[n]}" for n in servers}}
            env = {"AJET_SERVER_URL": url, "AJET_TRIAL_DIR": str(attempt_dir), "AJET_TRIAL_SEED": str(run.seed),
                   "AJET_TRIAL_PARAMS": json.dumps(client_params), **admin}
            clients = {n: ClientSpec(command=[_fill(part, marks) for part in c.command],
                                     env={**{k: _fill(v, marks) for k, v in c.env.items()}, **env})
                       for n, c in base.clients.items()}
        else:
            clients = {"trial": ClientSpec(command=[sys.executable, "-m", "agentjet.apps.research.trial_client",
                                                    "--server", url, "--settings", str(attempt_dir / "client.json"),
                                                    "--seed", str(run.seed), "--out", str(attempt_dir)], env=admin)}
        return {"servers": servers, "clients": {n: c.model_dump(mode="json") for n, c in clients.items()},
                "log_dir": str(attempt_dir / "logs")}

    def prepare(self, run: TrialRecord, attempt_dir: Path) -> dict[str, int]:
        """Write an attempt's `ajet up` spec (``trial.yaml``, on ports free on this machine) and the built-in
        client's settings (``client.json``) into ``attempt_dir``; returns the ports."""
        attempt_dir.mkdir(parents=True, exist_ok=True)
        ports = {name: free_port(self.base.host(name)) for name in self.base.servers}
        swarm = self.swarm(run, attempt_dir, ports)
        trial_file = attempt_dir / "trial.yaml"
        trial_file.touch(mode=0o600)  # it holds the trial servers' admin tokens
        trial_file.write_text(yaml.safe_dump(swarm, sort_keys=False))
        if self.client is not None:
            _, client_params = split_params(run.params)
            settings = self.client.model_copy(update=client_params)
            (attempt_dir / "client.json").write_text(settings.model_dump_json(indent=1))
        return ports


def _fill(text: str, marks: dict[str, str]) -> str:
    for key, value in marks.items():
        text = text.replace(key, value)
    return text


def get_status(http: httpx.Client, url: str) -> ServerStatus | None:
    try:
        r = http.get(f"{url}{SWARM_PREFIX}/status")
        return parse_status(r.json()) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, ValidationError):
        return None


def remove_checkpoints(attempt_dir: Path) -> None:
    import shutil

    for ckpt in attempt_dir.glob("server-*/checkpoints"):
        shutil.rmtree(ckpt, ignore_errors=True)


# ---------------------------------------------------------------------- local: a child process of this machine
class LocalHandle:
    def __init__(self, proc: TrialProcess, url: str, attempt_dir: Path, http: httpx.Client) -> None:
        self.proc = proc
        self.url = url
        self.dir = attempt_dir
        self._http = http

    def poll(self) -> Look:
        status = get_status(self._http, self.url)
        self.proc.refresh_children()
        alive = self.proc.alive()
        return Look(status=status, alive=alive, result=read_result(self.dir))  # the result is written before exit

    def record(self, attempt: Attempt) -> bool:
        changed = attempt.children != self.proc.children
        attempt.pid, attempt.create_time = self.proc.pid, self.proc.create_time
        attempt.children = list(self.proc.children)
        return changed

    def stop(self, grace_s: float, keep_checkpoints: bool) -> None:
        self.proc.stop(grace_s)
        if not keep_checkpoints:
            remove_checkpoints(self.dir)


class LocalExecutor:
    name = "local"

    def __init__(self) -> None:
        self._http = httpx.Client(timeout=5.0)

    def check(self, template: TrialTemplate) -> None:
        pass

    def launch(self, template: TrialTemplate, run: TrialRecord, attempt: Attempt, attempt_dir: Path) -> LocalHandle:
        ports = template.prepare(run, attempt_dir)
        proc = TrialProcess.launch(attempt_dir / "trial.yaml", attempt_dir / "up.log")
        attempt.port = ports[template.primary]
        handle = LocalHandle(proc, template.url(attempt.port), attempt_dir, self._http)
        handle.record(attempt)
        return handle

    def attach(self, template: TrialTemplate, run: TrialRecord, attempt: Attempt, attempt_dir: Path) -> LocalHandle:
        proc = TrialProcess.attach(attempt.pid or 0, attempt.create_time or 0.0, attempt.children)
        return LocalHandle(proc, template.url(attempt.port), attempt_dir, self._http)

    def close(self) -> None:
        self._http.close()


# ---------------------------------------------------------------------- files back from another machine
SKIP_DIRS = ("server-",)  # the servers' data dirs (checkpoints, sample stores) stay where they ran
MAX_CHUNK = 4 << 20  # bytes per file per poll
PRIVATE = {"trial.yaml"}  # it holds the trial servers' admin tokens: only its owner reads it, here as on the node

Chunk = tuple[str, int, bytes]  # (path relative to the attempt dir, offset, bytes from there)


class FileSync:
    """The node side: what changed in an attempt's directory since the last call, as chunks. A file that grew
    sends its new bytes; a file replaced (another inode) or shorter sends everything again. ``reset()``
    sends everything again (a driver that restarted has only part of the files)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._sent: dict[str, tuple[int, int]] = {}  # path -> (inode, bytes sent)

    def reset(self) -> None:
        self._sent.clear()

    def changes(self) -> list[Chunk]:
        out: list[Chunk] = []
        if not self.root.is_dir():
            return out
        for dirpath, dirnames, filenames in os.walk(self.root):
            base = Path(dirpath)
            dirnames[:] = [d for d in dirnames if not (base == self.root and d.startswith(SKIP_DIRS))]
            for name in sorted(filenames):
                path = base / name
                rel = str(path.relative_to(self.root))
                if name.startswith(".") and name.endswith(".tmp"):
                    continue
                try:
                    st = path.stat()
                    inode, sent = self._sent.get(rel, (st.st_ino, 0))
                    offset = sent if inode == st.st_ino and sent <= st.st_size else 0
                    if offset == st.st_size and rel in self._sent and inode == st.st_ino:
                        continue
                    with open(path, "rb") as f:
                        f.seek(offset)
                        data = f.read(MAX_CHUNK)
                except OSError:
                    continue
                self._sent[rel] = (st.st_ino, offset + len(data))
                out.append((rel, offset, data))
        # result.json last: when the driver reads it, the logs it ends are there
        out.sort(key=lambda c: c[0] == "result.json")
        return out


def apply_chunks(root: Path, chunks: list[Chunk]) -> None:
    """The driver side: write each chunk at its offset (the file cut there first), so applying one twice
    changes nothing. A chunk that would leave ``root`` is refused."""
    top = root.resolve()
    for rel, offset, data in chunks:
        path = (root / rel).resolve()
        if top not in path.parents:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel == "result.json":  # read by the study loop: whole or not at all
            from agentjet.files import write_atomic

            old = path.read_bytes()[:offset] if offset and path.exists() else b""
            write_atomic(path, old + data)
            continue
        if not path.exists() and rel in PRIVATE:
            path.touch(mode=0o600)
        with open(path, "r+b" if path.exists() else "wb") as f:
            f.truncate(offset)
            f.seek(offset)
            f.write(data)


def actor_name(run: TrialRecord, number: int) -> str:
    """A Ray actor's name: the run, the attempt, and a random part (two studies may have a run t000)."""
    return f"ajet-trial-{run.id}-a{number}-{secrets.token_hex(4)}"
