"""``ProcessHFGenerator``: the server's face of an engine process (see the package's docstring for the interface).

It owns one thread, which starts the engine process (``runtime/proc.py: Child``, with the parent-death signal
tied to this thread: the engine dies with the generator, or with a server that was killed), accepts its
connection on a Unix socket in a private directory (mode 0700), and then reads its frames
(``connection.py: EngineConnection``) until the connection breaks or the generator is closed. When it breaks
(the engine exited, or said nothing for ``heartbeat_timeout_s``), the engine process is stopped and every request
in flight, and every later one, fails with ``EngineUnavailableError``: a 503, never a hang. It is not restarted
here; whoever holds several replicas replaces one (a new ``ProcessHFGenerator`` brought to the learner's weights
by a push).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentjet.engines.base import GenerationResult, Generator, SamplingParams, TokenCallback
from agentjet.engines.errors import EngineUnavailableError
from agentjet.engines.model import ModelFacts
from agentjet.generators.hf.base import int_counters, no_named_adapters, served_context
from agentjet.generators.hf.engine_process.connection import POLL_S, EngineConnection
from agentjet.generators.hf.engine_process.spec import EngineSpec
from agentjet.generators.hf.engine_process.wire import Op
from agentjet.generators.hf.rows import RowRules
from agentjet.runtime.proc import Child
from agentjet.settings import GeneratorSettings, PlacementSettings

log = logging.getLogger(__name__)
CHILD_MODULE = "agentjet.generators.hf.engine_process.child"
WIRE = "msgpack frames over a Unix stream socket"


class EngineStartError(RuntimeError):
    """The engine process did not start (its log's tail is in the message)."""


class ProcessHFGenerator(Generator):
    """The embedded generator with continuous batching, its scheduler, KV cache and model in an engine process of
    its own. Built from the model's facts (tokenizer, stop ids, context: the server keeps them) and the settings;
    the engine process starts at once, ``wait_ready`` waits for it."""

    def __init__(self, facts: ModelFacts, settings: GeneratorSettings | None = None,
                 placement: PlacementSettings | None = None, log_path: Path | None = None) -> None:
        self.settings = settings = settings or GeneratorSettings()
        self.facts = facts
        self._max_context = served_context(settings, facts.context_length)
        self.rules = RowRules(facts.tokenizer, self._max_context, set(facts.stop_ids), settings.seed)
        self._version = 0
        self._dir = Path(tempfile.mkdtemp(prefix="agentjet-engine-"))  # mode 0700: only this user connects
        self.log_path = log_path or self._dir / "engine.log"
        self.spec = EngineSpec(model=facts.path, generator=settings, placement=placement or PlacementSettings(),
                               socket=self._dir / "engine.sock")
        self.child: Child | None = None
        self.connection: EngineConnection | None = None
        self._start_error: str | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._own, name="agentjet-engine-process", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the owning thread
    def _own(self) -> None:
        try:
            conn = self._start()
        except Exception as exc:  # noqa: BLE001 - reported by wait_ready and every request
            self._start_error = f"{type(exc).__name__}: {exc}"
            self._stop_child()
            return
        conn.read_until_broken(self._child_alive)
        if not self._closed:
            log.error("%s; the engine process's log (%s):\n%s", conn.failure, self.log_path, self._log_tail())
        self._stop_child()

    def _start(self) -> EngineConnection:
        process = self.settings.process
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.spec.socket))
            listener.listen(1)
            listener.settimeout(POLL_S)
            spec_path = self.spec.write(self._dir / "spec.json")
            env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
            self.child = Child.spawn([sys.executable, "-m", CHILD_MODULE, str(spec_path)], self.log_path, env=env,
                                     header=f"==> engine process for {self.facts.path}",
                                     parent_death_signal=signal.SIGTERM)
            deadline = time.monotonic() + process.startup_timeout_s
            sock = self._accept(listener, deadline)
        finally:
            listener.close()
        self.connection = EngineConnection(sock, process.heartbeat_timeout_s, process.startup_timeout_s,
                                           explain=self._exit_note)
        return self.connection

    def _accept(self, listener: socket.socket, deadline: float) -> socket.socket:
        """The engine process's connection; ``EngineStartError`` when it exits first or the deadline passes."""
        while True:
            try:
                return listener.accept()[0]
            except TimeoutError:
                if not self._child_alive():
                    code = self.child.poll() if self.child is not None else None
                    raise EngineStartError(f"the engine process exited with code {code} before it connected") \
                        from None
                if time.monotonic() > deadline or self._closed:
                    raise EngineStartError("the engine process did not connect within "
                                           f"{self.settings.process.startup_timeout_s:.0f} s") from None

    def _exit_note(self) -> str:
        """`` (exit code N)`` once the engine process has exited (it is given a moment to)."""
        code = self.child.wait(2.0) if self.child is not None else None
        return f" (exit code {code})" if code is not None else ""

    def _child_alive(self) -> bool:
        return self.child is not None and self.child.alive()

    def _stop_child(self) -> None:
        if self.child is not None:
            self.child.stop(self.settings.process.stop_timeout_s)

    def _log_tail(self) -> str:
        return self.child.tail(15) if self.child is not None else "(not started)"

    def wait_ready(self) -> ProcessHFGenerator:
        """Block until the engine process has loaded the model and said HELLO; ``EngineStartError`` (with its
        log's tail) when it fails or takes longer than ``generator.process.startup_timeout_s``."""
        deadline = time.monotonic() + self.settings.process.startup_timeout_s + 5
        while True:
            conn = self.connection
            failure = self._start_error or (str(conn.failure) if conn is not None and conn.failure else None)
            if failure is None and conn is not None and conn.hello.is_set():
                return self
            if failure is None and time.monotonic() > deadline:
                failure = "no HELLO in time"
            if failure is not None:
                raise EngineStartError(f"the engine process did not start: {failure}; its log ({self.log_path}):\n"
                                       f"{self._log_tail()}")
            time.sleep(0.02)

    def _ready(self) -> EngineConnection:
        conn = self.connection
        if self._closed:
            raise EngineUnavailableError("the engine is closed")
        if conn is None or not conn.hello.is_set():
            if self._start_error is not None:
                raise EngineUnavailableError(f"the engine process did not start: {self._start_error}")
            raise EngineUnavailableError("the engine process is starting", retry_after_s=5.0)
        return conn

    # ------------------------------------------------------------------ the Generator interface
    @property
    def tokenizer(self) -> Any:
        return self.facts.tokenizer

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def capacity(self) -> int:
        return self.settings.max_batch_size

    @property
    def policy_version(self) -> int:  # type: ignore[override]  # read-only: it moves when the engine holds them
        """The version of the weights the engine process holds (moved only when it confirms a load)."""
        return self._version

    @property
    def alive(self) -> bool:
        """Whether the engine process is connected and serving (False while starting, after a failure or close)."""
        conn = self.connection
        return conn is not None and conn.hello.is_set() and conn.failure is None and not self._closed

    @property
    def stats(self) -> dict[str, Any]:
        """The engine's counters as it last sent them (exact when it is idle; at most 0.25 s old under load)."""
        return dict(self.connection.stats) if self.connection is not None else {}

    def counters(self) -> dict[str, int]:
        return int_counters(self.stats)

    def describe(self) -> dict[str, Any]:
        conn = self.connection
        info: dict[str, Any] = dict(conn.description) if conn is not None and conn.description else {
            "kind": "hf", "model": str(self.facts.path), "batching": "continuous",
            "max_batch_size": self.settings.max_batch_size, "max_context": self._max_context}
        info.pop("policy_version", None)
        info["engine_process"] = {"pid": self.child.pid if self.child is not None else None, "wire": WIRE,
                                  "alive": self.alive, "log": str(self.log_path)}
        return info

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None, adapter: str | None = None) -> GenerationResult:
        if adapter is not None:
            raise no_named_adapters(adapter)
        self.rules.check_prompt(prompt_ids)  # a bad prompt is refused here, without a round trip
        conn = self._ready()
        stops = self.rules.stop_ids | frozenset(sampling.stop_token_ids)  # the engine stops on these alone
        if stops != frozenset(sampling.stop_token_ids):
            sampling = replace(sampling, stop_token_ids=tuple(sorted(stops)))
        return await conn.generate(list(prompt_ids), sampling, on_token, self.settings.process.request_timeout_s)

    # ------------------------------------------------------------------ weights and control
    async def load_weights(self, path: Path, policy_version: int) -> None:
        """The engine process copies a model directory's (or a safetensors file's) weights into its live
        parameters in place, between decode steps (``HFGenerator.load_weights`` there); new requests are
        generated at ``policy_version`` from the moment it answers. (On one host the file is in /dev/shm; NCCL
        into a GPU group's engine is a seam not built here: ``load_weights`` is where it would land.)"""
        conn = self._ready()
        await conn.call(Op.LOAD_WEIGHTS, str(path), policy_version, timeout_s=self.settings.process.control_timeout_s)
        self._version = policy_version

    async def ping(self) -> float:
        """The round trip of a control call to the engine's event loop, in seconds."""
        t0 = time.perf_counter()
        await self._ready().call(Op.PING, timeout_s=self.settings.process.control_timeout_s)
        return time.perf_counter() - t0

    async def close(self) -> None:
        """Ask the engine process to shut down (within ``stop_timeout_s``), then stop it; every request still in
        flight fails with ``EngineUnavailableError``."""
        if self._closed:
            return
        self._closed = True
        conn = self.connection
        if conn is not None and conn.failure is None:
            with contextlib.suppress(EngineUnavailableError):
                await conn.call(Op.SHUTDOWN, timeout_s=self.settings.process.stop_timeout_s)
            conn.fail(EngineUnavailableError("the engine was closed"))
        await asyncio.to_thread(self._finish)

    def _finish(self) -> None:
        self._thread.join(self.settings.process.stop_timeout_s + 10)
        self._stop_child()
        shutil.rmtree(self._dir, ignore_errors=True)
