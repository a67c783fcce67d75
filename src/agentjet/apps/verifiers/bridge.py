"""AgentJet's side of ``ajet verifiers``: start the verifiers worker (``worker.py``) in the verifiers venv and ask
it for one episode at a time, over a Unix socket in JSON lines.

The swarm side stays here, in AgentJet's venv, with AgentJet's own client (``runner.py``); the worker only runs
verifiers. The two venvs cannot be one: verifiers 0.4 pins ``openai<3`` and AgentJet uses openai 3.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from agentjet.runtime.proc import Child

WORKER = Path(__file__).with_name("worker.py")
DEFAULT_PYTHON = Path(".venv-verifiers/bin/python")  # made by `make setup-verifiers`; relative to the cwd
PYTHON_VAR = "AGENTJET_VERIFIERS_PYTHON"


class WorkerError(RuntimeError):
    """The worker could not start, or died."""


class VerifiersEpisodeError(RuntimeError):
    """verifiers ran the episode but it failed (no reward): the swarm episode is aborted, not ended."""


@dataclass(frozen=True)
class WorkerOptions:
    """How the worker loads its environment (the flags of ``worker.py``)."""

    taskset: str
    env_id: str = ""
    paths: tuple[Path, ...] = ()
    harness: str = "null"
    runtime: str = "subprocess"
    model: str = "agent"
    limit: int | None = None
    env_config: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    loopback_only: bool = False


@dataclass(frozen=True)
class VerifiersTask:
    index: int
    key: str
    id: str | None
    name: str | None


@dataclass(frozen=True)
class EpisodeOutcome:
    """What verifiers made of one episode: ``reward`` is the environment's own score (None when it failed)."""

    ok: bool
    reward: float | None
    traces: list[dict[str, Any]]
    errors: list[str]

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> EpisodeOutcome:
        reward = reply.get("reward")
        return cls(ok=bool(reply.get("ok")), reward=None if reward is None else float(reward),
                   traces=list(reply.get("traces") or []), errors=[str(e) for e in reply.get("errors") or []])

    def require_reward(self) -> float:
        if not self.ok or self.reward is None:
            raise VerifiersEpisodeError("; ".join(self.errors) or "the verifiers episode gave no reward")
        return self.reward


def resolve_python(python: Path | None) -> Path:
    """The verifiers venv's interpreter: the argument, else ``$AGENTJET_VERIFIERS_PYTHON``, else
    ``.venv-verifiers/bin/python``."""
    chosen = python or Path(os.environ.get(PYTHON_VAR) or DEFAULT_PYTHON)
    if not chosen.exists():
        raise WorkerError(f"no verifiers interpreter at {chosen}: run `make setup-verifiers`, or give "
                          f"--verifiers-python (or ${PYTHON_VAR}) a venv with verifiers==0.4.0")
    return chosen


def worker_command(python: Path, socket_path: Path, options: WorkerOptions) -> list[str]:
    argv = [str(python), str(WORKER), "--socket", str(socket_path), "--taskset", options.taskset,
            "--harness", options.harness, "--runtime", options.runtime, "--model", options.model]
    if options.env_id:
        argv += ["--env-id", options.env_id]
    for path in options.paths:
        argv += ["--path", str(path)]
    if options.limit is not None:
        argv += ["--limit", str(options.limit)]
    if options.env_config:
        argv += ["--env-config", json.dumps(options.env_config)]
    if options.sampling:
        argv += ["--sampling", json.dumps(options.sampling)]
    if options.loopback_only:
        argv.append("--loopback-only")
    return argv


def worker_env(python: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The worker's environment: the verifiers venv's ``bin`` first on ``PATH`` (its ``uv`` sets up the harness
    program), and no key of Prime's, so nothing can reach Prime's cloud with one."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    for name in ("PRIME_API_KEY", "PRIME_TEAM_ID"):
        env.pop(name, None)
    return env


class VerifiersWorker:
    """The worker process and its connection. ``async with VerifiersWorker(...) as worker``: then
    ``worker.tasks`` and ``await worker.episode(index, base_url, api_key)``."""

    def __init__(self, options: WorkerOptions, python: Path | None = None, log_path: Path | None = None,
                 start_timeout_s: float = 600.0) -> None:
        self.options = options
        self.python = resolve_python(python)
        self.start_timeout_s = start_timeout_s
        self._dir = Path(tempfile.mkdtemp(prefix="ajet-vf-"))
        self.socket_path = self._dir / "worker.sock"
        self.log_path = log_path or self._dir / "worker.log"
        self.child: Child | None = None
        self.tasks: list[VerifiersTask] = []
        self.env_id = ""
        self.verifiers_version = ""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._listen: asyncio.Task[None] | None = None

    async def __aenter__(self) -> VerifiersWorker:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def start(self) -> None:
        argv = worker_command(self.python, self.socket_path, self.options)
        self.child = Child.spawn(argv, self.log_path, env=worker_env(self.python), append=False,
                                 parent_death_signal=signal.SIGTERM)
        self._reader, self._writer = await self._connect()
        ready = json.loads(await self._reader.readline() or b"{}")
        if ready.get("type") != "ready":
            raise WorkerError(f"the verifiers worker did not say ready: {ready!r}\n{self.child.tail()}")
        self.env_id = str(ready["env_id"])
        self.verifiers_version = str(ready.get("verifiers", ""))
        self.tasks = [VerifiersTask(int(t["index"]), str(t["key"]), t.get("id"), t.get("name"))
                      for t in ready["tasks"]]
        self._listen = asyncio.create_task(self._dispatch())

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Until the worker listens (it loads the environment first), or it exits, or the timeout."""
        assert self.child is not None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.child.poll() is not None:
                raise WorkerError(f"the verifiers worker exited with code {self.child.poll()}; see "
                                  f"{self.log_path}:\n{self.child.tail()}")
            if self.socket_path.exists():
                with contextlib.suppress(OSError):
                    return await asyncio.open_unix_connection(str(self.socket_path), limit=1 << 24)
            await asyncio.sleep(0.1)
        raise WorkerError(f"the verifiers worker did not listen within {self.start_timeout_s:.0f}s; see "
                          f"{self.log_path}")

    async def _dispatch(self) -> None:
        assert self._reader is not None
        try:
            while line := await self._reader.readline():
                reply = json.loads(line)
                future = self._pending.pop(int(reply.get("id", -1)), None)
                if future is not None and not future.done():
                    future.set_result(reply)
        finally:
            tail = self.child.tail() if self.child is not None else ""
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(WorkerError(f"the verifiers worker went away; see {self.log_path}:\n{tail}"))
            self._pending.clear()

    async def episode(self, index: int, base_url: str, api_key: str) -> EpisodeOutcome:
        """Run task ``index`` as one verifiers episode against ``base_url`` with ``api_key``."""
        if self._writer is None or self._listen is None or self._listen.done():
            raise WorkerError(f"the verifiers worker is not running; see {self.log_path}")
        request_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        line = {"id": request_id, "index": index, "base_url": base_url, "api_key": api_key}
        self._writer.write((json.dumps(line) + "\n").encode())
        await self._writer.drain()
        return EpisodeOutcome.from_reply(await future)

    async def close(self, grace_s: float = 30.0) -> None:
        """Close the connection (the worker finishes what runs and exits), then stop it if it lingers."""
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        if self._listen is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._listen, grace_s)
        if self.child is not None:
            child = self.child
            if await asyncio.to_thread(child.wait, grace_s) is None:
                await asyncio.to_thread(child.stop, 5.0)
        with contextlib.suppress(OSError):
            self.socket_path.unlink()

