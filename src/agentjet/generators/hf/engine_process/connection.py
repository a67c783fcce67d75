"""The server's end of an engine process's socket (``EngineConnection``): it sends requests, cancellations and
control calls, and its reader (run on the thread that owns the engine process, ``generator.py``) hands what comes
back to the callers: stream tokens and results to each caller's own event loop (one thread-safe wake-up per loop
per frame), control replies to their futures, the counters to ``stats``.

Sends never block the caller: a frame goes out at once when the socket takes it, else the rest waits in a backlog
that the reader's thread writes when the socket is writable. Every wait has a bound: a request its
``request_timeout_s``, a control call its own timeout, and the engine as a whole ``heartbeat_timeout_s`` of
silence (it says BEAT every second when it has nothing else to say). When the connection breaks (the engine
exited, stopped answering, or was closed), every request and call in flight fails with an
``EngineUnavailableError`` and so does every later one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentjet.engines.base import GenerationResult, SamplingParams, TokenCallback
from agentjet.engines.errors import EngineUnavailableError
from agentjet.generators.hf.engine_process import wire
from agentjet.generators.hf.engine_process.wire import Kind, Op

log = logging.getLogger(__name__)
POLL_S = 0.1  # the reader's longest sleep: how soon it notices a backlog, a silent engine or a close
READ_BYTES = 1 << 20


@dataclass
class _Pending:
    future: asyncio.Future[GenerationResult]
    on_token: TokenCallback | None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.future.get_loop()


def _settle(fut: asyncio.Future[GenerationResult], outcome: GenerationResult | Exception) -> None:
    if fut.done():
        return
    if isinstance(outcome, Exception):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)


def _run_all(calls: list[Callable[[], None]]) -> None:
    for call in calls:
        try:
            call()
        except Exception:  # a stream callback's own failure: logged, the other callers go on
            log.exception("a token callback failed")


class EngineConnection:
    """One connected engine process. Before its HELLO it may be silent for ``startup_timeout_s`` (it loads the
    model), after it for ``heartbeat_timeout_s``. ``explain()``: what to add to the error when the engine's end
    closed (its exit code)."""

    def __init__(self, sock: socket.socket, heartbeat_timeout_s: float, startup_timeout_s: float,
                 explain: Callable[[], str] = lambda: "") -> None:
        sock.setblocking(False)
        self.sock = sock
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.explain = explain
        self.stats: dict[str, Any] = {}
        self.description: dict[str, Any] = {}
        self.hello = threading.Event()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # guards the pending maps, the backlog and ``failure``
        self._requests: dict[int, _Pending] = {}
        self._calls: dict[int, concurrent.futures.Future[Any]] = {}
        self._backlog = bytearray()
        self.failure: EngineUnavailableError | None = None
        self._heard = time.monotonic()

    # ------------------------------------------------------------------ the callers' side
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, on_token: TokenCallback | None,
                       timeout_s: float) -> GenerationResult:
        rid = next(self._ids)
        fut: asyncio.Future[GenerationResult] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._raise_if_broken()
            self._requests[rid] = _Pending(fut, on_token)
        try:
            self._send([[Kind.GENERATE, rid, prompt_ids, wire.encode_sampling(sampling), on_token is not None]])
        except EngineUnavailableError:
            with self._lock:
                self._requests.pop(rid, None)
            raise
        try:
            async with asyncio.timeout(timeout_s):
                return await fut
        except TimeoutError:
            self._cancel(rid)
            raise EngineUnavailableError(f"the engine process did not finish the request within {timeout_s:.0f} s "
                                         "(generator.process.request_timeout_s)") from None
        except asyncio.CancelledError:
            self._cancel(rid)  # the caller went away: its row is dropped at the engine's next step
            raise

    def _cancel(self, rid: int) -> None:
        with self._lock:
            gone = self._requests.pop(rid, None) is not None and self.failure is None
        if gone:
            with contextlib.suppress(EngineUnavailableError):
                self._send([[Kind.CANCEL, rid]])

    def call_future(self, op: Op, *args: Any) -> concurrent.futures.Future[Any]:
        """A control call; its future (await it with ``asyncio.wrap_future``, or block on ``result(timeout)``)."""
        cid = next(self._ids)
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            self._raise_if_broken()
            self._calls[cid] = fut
        try:
            self._send([[Kind.CALL, cid, op.value, list(args)]])
        except EngineUnavailableError:
            with self._lock:
                self._calls.pop(cid, None)
            raise
        return fut

    async def call(self, op: Op, *args: Any, timeout_s: float) -> Any:
        fut = self.call_future(op, *args)
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.wrap_future(fut)
        except TimeoutError:
            raise EngineUnavailableError(f"the engine process did not answer {op.value} within {timeout_s:.0f} s") \
                from None

    def _raise_if_broken(self) -> None:
        if self.failure is not None:
            raise EngineUnavailableError(str(self.failure))

    def _send(self, messages: list[list[Any]]) -> None:
        data = wire.pack(messages)
        with self._lock:
            self._raise_if_broken()
            try:
                if not self._backlog:
                    sent = self.sock.send(data)
                    if sent == len(data):
                        return
                    data = data[sent:]
                self._backlog += data  # the reader's thread writes it when the socket takes more
                return
            except BlockingIOError:
                self._backlog += data
                return
            except OSError as exc:
                broken = EngineUnavailableError(f"the engine process's socket failed: {exc}")
        self.fail(broken)
        raise EngineUnavailableError(str(broken))

    # ------------------------------------------------------------------ the reader's side (one thread)
    def read_until_broken(self, alive: Callable[[], bool]) -> None:
        """Read and dispatch frames until the connection breaks or is failed (``fail``); ``alive()``: whether the
        engine process still runs. Returns after ``failure`` is set."""
        unpacker = wire.unpacker()
        while self.failure is None:
            with self._lock:
                want_write = bool(self._backlog)
            try:
                readable, writable, _ = select.select([self.sock], [self.sock] if want_write else [], [], POLL_S)
                if writable:
                    self._write_backlog()
                if readable:
                    data = self.sock.recv(READ_BYTES)
                    if not data:
                        self.fail(EngineUnavailableError(f"the engine process closed its connection{self.explain()}"))
                        return
                    self._heard = time.monotonic()
                    unpacker.feed(data)
                    for frame in unpacker:
                        self._dispatch(frame)
            except (OSError, ValueError) as exc:  # ValueError: a closed socket, or a frame that does not decode
                self.fail(EngineUnavailableError(f"the engine process's connection failed: {exc}"))
                return
            silent = time.monotonic() - self._heard
            limit, setting = ((self.heartbeat_timeout_s, "heartbeat_timeout_s") if self.hello.is_set()
                              else (self.startup_timeout_s, "startup_timeout_s"))
            if silent > limit:
                self.fail(EngineUnavailableError(f"the engine process said nothing for {silent:.0f} s "
                                                 f"(generator.process.{setting})"))
            elif not readable and not alive():
                self.fail(EngineUnavailableError(f"the engine process exited{self.explain()}"))

    def _write_backlog(self) -> None:
        with self._lock:
            try:
                sent = self.sock.send(self._backlog)
            except BlockingIOError:
                return
            del self._backlog[:sent]

    def _dispatch(self, frame: list[list[Any]]) -> None:
        calls: dict[asyncio.AbstractEventLoop, list[Callable[[], None]]] = {}
        for message in frame:
            kind = message[0]
            if kind == Kind.TOKENS:
                _, rids, tokens, logprobs = message
                with self._lock:
                    pending = [self._requests.get(rid) for rid in rids]
                for p, token, lp in zip(pending, tokens, logprobs, strict=True):
                    if p is not None and p.on_token is not None:
                        calls.setdefault(p.loop, []).append(functools.partial(p.on_token, token, lp))
            elif kind in (Kind.DONE, Kind.FAIL):
                _, rid, body = message
                with self._lock:
                    p = self._requests.pop(rid, None)
                if p is not None:
                    outcome = wire.decode_result(body) if kind == Kind.DONE else wire.decode_error(body)
                    calls.setdefault(p.loop, []).append(functools.partial(_settle, p.future, outcome))
            elif kind == Kind.REPLY:
                _, cid, ok, value = message
                with self._lock:
                    fut = self._calls.pop(cid, None)
                if fut is not None and not fut.done():
                    if ok:
                        fut.set_result(value)
                    else:
                        fut.set_exception(wire.decode_error(value))
            elif kind == Kind.STATS:
                _, self.stats, self.description = message
            elif kind == Kind.HELLO:
                self.description = message[1]
                self.hello.set()
        for loop, batch in calls.items():
            with contextlib.suppress(RuntimeError):  # the caller's event loop is closed
                loop.call_soon_threadsafe(_run_all, batch)

    def fail(self, exc: EngineUnavailableError) -> None:
        """Break the connection: every request and call in flight, and every later one, fails with ``exc``."""
        with self._lock:
            if self.failure is not None:
                return
            self.failure = exc
            requests, self._requests = self._requests, {}
            calls, self._calls = self._calls, {}
            self._backlog.clear()
        if requests or calls:
            log.error("%s: failing %d request(s) and %d call(s) in flight", exc, len(requests), len(calls))
        for fut in calls.values():
            if not fut.done():
                fut.set_exception(exc)
        by_loop: dict[asyncio.AbstractEventLoop, list[Callable[[], None]]] = {}
        for p in requests.values():
            by_loop.setdefault(p.loop, []).append(functools.partial(_settle, p.future, exc))
        for loop, batch in by_loop.items():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_run_all, batch)
        with contextlib.suppress(OSError):
            self.sock.close()

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._requests)
