"""The server's side of replica processes (``ajet generator``, ``host.py``): ``RemoteGenerator``, a ``Generator``
over one replica's connection (``wire.py``); ``RemoteReplica``, the handle of a replica that dials in (a Ray actor's,
``ray_replicas.py``; a machine that joined by hand, ``JoinedReplica``); and ``JoinListener``, the join address every one of them dials with the fleet's secret.

A replica that joins by hand (``ajet generator --join HOST:PORT``) is added to the fleet under its name (its own
``--name``, else ``<host>-<pid>``), caught up to the newest weights and put in rotation. If it dies, it is out of
rotation at once (its connection closed) and comes back when it joins again under the same name.

Weights reach a replica process as a path when it sees the same files (on this machine, or ``weights: shared``),
else over its connection, a chunk at a time.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import itertools
import logging
import socket
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from agentjet.engines.base import GenerationResult, Generator, SamplingParams, TokenCallback
from agentjet.engines.errors import EngineUnavailableError, GenerationError
from agentjet.generators.fleet.replica import Replica, ReplicaDown, Weights
from agentjet.generators.fleet.wire import (
    CHUNK_BYTES,
    Cancel,
    Failed,
    Generate,
    Hello,
    Init,
    Link,
    LinkClosed,
    Loaded,
    LoadWeights,
    Ping,
    Pong,
    Ready,
    Result,
    Shutdown,
    Tokens,
    WeightChunk,
)
from agentjet.weights.io import weights_file

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0  # a dialer that proved the secret says hello within this, or is dropped


class RemoteGenerator(Generator):
    """One replica process, over its connection. Made on the fleet's loop when the process dials in; ``ready``
    resolves once it has loaded its model."""

    def __init__(self, hello: Hello, tokenizer: Any, conn: Connection, name: str) -> None:
        self.hello = hello
        self.name = name
        self._tokenizer = tokenizer
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[Ready] = loop.create_future()
        self._calls: dict[int, tuple[asyncio.Future[GenerationResult], TokenCallback | None]] = {}
        self._waits: dict[tuple[str, int], asyncio.Future[Any]] = {}  # pings and loads by ("ping"|"load", id)
        self._ids = itertools.count()
        self._counters: dict[str, int] = {}
        self._info: dict[str, Any] = {}
        self.policy_version = 0
        self.link = Link(conn, loop, self.on_message, name=f"replica-{name}")

    # ------------------------------------------------------------------ the Generator face
    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_context(self) -> int:
        return self.ready.result().max_context if self.ready.done() else 4096

    @property
    def capacity(self) -> int:
        return self.ready.result().capacity if self.ready.done() else 1

    def counters(self) -> dict[str, int]:
        return dict(self._counters)

    def describe(self) -> dict[str, Any]:
        return dict(self._info)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None, adapter: str | None = None) -> GenerationResult:
        call = next(self._ids)
        future: asyncio.Future[GenerationResult] = asyncio.get_running_loop().create_future()
        self._calls[call] = (future, on_token)
        try:
            self._send(Generate(call, list(prompt_ids), sampling, adapter))
            return await future
        except asyncio.CancelledError:
            with contextlib.suppress(LinkClosed):
                self.link.send(Cancel(call))
            raise
        finally:
            self._calls.pop(call, None)

    # ------------------------------------------------------------------ control
    async def ping(self) -> None:
        pong: Pong = await self._wait("ping", lambda n: Ping(n))
        self._counters = dict(pong.counters)

    async def load(self, weights: Weights, by_path: bool) -> None:
        """Bring the replica to ``weights``: their path (it sees the same files), or the safetensors file sent over
        the connection, a chunk at a time (between chunks its tokens keep coming)."""
        if by_path:
            msg: Loaded = await self._wait("load", lambda n: LoadWeights(n, weights.version, str(weights.path)))
        else:
            msg = await self._wait("load", lambda n: self._send_file(n, weights))
        if msg.error is not None:
            raise RuntimeError(f"replica {self.name} did not take policy v{weights.version}: {msg.error}")
        self.policy_version = msg.version

    async def _send_file(self, n: int, weights: Weights) -> LoadWeights:
        with open(weights_file(Path(weights.path)), "rb") as f:
            while chunk := await asyncio.to_thread(f.read, CHUNK_BYTES):
                await self.link.send_sent(WeightChunk(n, chunk))
        return LoadWeights(n, weights.version, None)

    async def _wait(self, kind: str, make: Callable[[int], Any]) -> Any:
        n = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waits[(kind, n)] = future
        try:
            msg = make(n)
            if asyncio.iscoroutine(msg):
                msg = await msg
            self._send(msg)
            return await future
        except LinkClosed as exc:
            raise ReplicaDown(f"replica {self.name}: its connection is closed") from exc
        finally:
            self._waits.pop((kind, n), None)

    def _send(self, msg: object) -> None:
        try:
            self.link.send(msg)
        except LinkClosed as exc:
            raise ReplicaDown(f"replica {self.name}: its connection is closed") from exc

    def shutdown(self) -> None:
        with contextlib.suppress(LinkClosed):
            self.link.send(Shutdown())

    # ------------------------------------------------------------------ what it says
    def on_message(self, msg: object | None) -> None:
        if msg is None:
            self._closed()
        elif isinstance(msg, Tokens):
            for call, token, logprob in msg.items:
                entry = self._calls.get(call)
                if entry is not None and entry[1] is not None:
                    entry[1](token, logprob)
        elif isinstance(msg, Result):
            _settle(self._calls.get(msg.call, (None,))[0], msg.result)
        elif isinstance(msg, Failed):
            _settle(self._calls.get(msg.call, (None,))[0], error=_error(msg))
        elif isinstance(msg, Loaded):
            _settle(self._waits.get(("load", msg.load)), msg)
        elif isinstance(msg, Pong):
            _settle(self._waits.get(("ping", msg.n)), msg)
        elif isinstance(msg, Ready):
            self.policy_version = msg.version
            self._info = dict(msg.info)
            _settle(self.ready, msg)
        else:
            log.warning("replica %s sent %r; ignored", self.name, msg)

    def _closed(self) -> None:
        down = ReplicaDown(f"replica {self.name}: its connection closed (the process died or was stopped)")
        for future, _ in list(self._calls.values()):
            _settle(future, error=down)
        for future in list(self._waits.values()):
            _settle(future, error=down)
        _settle(self.ready, error=down)


def _settle(future: asyncio.Future[Any] | None, value: Any = None, error: BaseException | None = None) -> None:
    if future is None or future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _error(msg: Failed) -> Exception:
    if msg.kind == "request":
        return GenerationError(msg.message, param=msg.param)
    if msg.kind == "unavailable":
        return EngineUnavailableError(msg.message)
    return RuntimeError(msg.message)


class RemoteReplica(Replica):
    """A replica that runs as a process of its own and dials in. A subclass says how it is launched and killed;
    ``start`` launches it and waits for its connection (``offer``, from the listener) and its ``Ready``."""

    def __init__(self, name: str, init: Init, tokenizer: Any, weights_by_path: Callable[[Hello], bool]) -> None:
        self.name = name
        self.init = init
        self.tokenizer = tokenizer
        self.weights_by_path = weights_by_path
        self._remote: RemoteGenerator | None = None
        self._joined: asyncio.Future[RemoteGenerator] | None = None
        self._offered: RemoteGenerator | None = None  # a connection that came before start waited for it

    @abc.abstractmethod
    async def launch(self) -> None:
        """Start its process (it dials in)."""

    @abc.abstractmethod
    async def kill(self) -> None:
        """Stop its process, if it has one here."""

    def process_alive(self) -> bool:
        return True

    @property
    def generator(self) -> RemoteGenerator:
        if self._remote is None:
            raise ReplicaDown(f"replica {self.name} is not connected")
        return self._remote

    @property
    def version(self) -> int:
        return self._remote.policy_version if self._remote is not None else 0

    def offer(self, conn: Connection, hello: Hello) -> None:
        """A connection for this replica (on the fleet's loop): it gets its ``Init`` and, once ready, serves."""
        if self._remote is not None and self._remote.link.open:
            log.warning("replica %s dialed in again while connected; the new connection is dropped", self.name)
            conn.close()
            return
        remote = RemoteGenerator(hello, self.tokenizer, conn, self.name)
        with contextlib.suppress(ReplicaDown):
            remote._send(self.init)
        if self._joined is not None and not self._joined.done():
            self._joined.set_result(remote)
        else:
            if self._offered is not None:
                self._offered.link.close()
            self._offered = remote

    async def start(self) -> None:
        self._remote = None
        self._joined = asyncio.get_running_loop().create_future()
        if self._offered is not None:
            self._joined.set_result(self._offered)
            self._offered = None
        else:
            await self.launch()
        remote = await self._joined
        await remote.ready
        self._remote = remote

    def alive(self) -> bool:
        return self._remote is not None and self._remote.link.open and self.process_alive()

    async def ping(self) -> None:
        await self.generator.ping()

    async def load(self, weights: Weights) -> None:
        remote = self.generator
        await remote.load(weights, self.weights_by_path(remote.hello))

    async def stop(self) -> None:
        remote, self._remote = self._remote, None
        if remote is not None:
            remote.shutdown()
            remote.link.close()
        await self.kill()


class JoinedReplica(RemoteReplica):
    """A machine that joined by hand: nothing to launch or kill here; once out of rotation it waits to join again
    under the same name (its operator's supervisor, or the operator, starts ``ajet generator --join`` again)."""

    start_timeout_s = 7 * 86_400.0

    def where(self) -> str:
        hello = self._remote.hello if self._remote is not None else None
        return f"joined from {hello.host} (pid {hello.pid})" if hello else "joined (waiting to join again)"

    async def launch(self) -> None:
        log.info("replica %s: waiting for it to join again (ajet generator --join ... --name %s)", self.name,
                 self.name)

    async def kill(self) -> None:
        return None


class JoinListener:
    """The fleet's join address: every replica process dials it with the fleet's secret and says ``Hello``. A
    name the fleet knows (a replica it started, a joined one coming back) gets the connection; a new one is
    ``on_new(name, hello)``'s replica, which joins the fleet. Runs an accept thread; ``offer``s run on ``loop``."""

    def __init__(self, host: str, port: int, token: str, loop: asyncio.AbstractEventLoop,
                 on_new: Callable[[str, Hello], RemoteReplica | None]) -> None:
        self.listener = Listener((host, port), family="AF_INET", authkey=token.encode())
        self.token = token
        self.loop = loop
        self.on_new = on_new
        self.known: dict[str, RemoteReplica] = {}
        self._stop = threading.Event()
        threading.Thread(target=self._accept_loop, name="agentjet-fleet-join", daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.listener.address[1])

    def address(self, advertise: str | None = None) -> str:
        """``host:port`` a replica dials: ``advertise`` (this machine's address as others see it), else the bound
        host (loopback for 0.0.0.0)."""
        host = self.listener.address[0]
        return f"{advertise or ('127.0.0.1' if host in ('0.0.0.0', '') else host)}:{self.port}"

    def expect(self, replica: RemoteReplica) -> None:
        self.known[replica.name] = replica

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn = self.listener.accept()
            except OSError:
                if self._stop.is_set():
                    return
                continue
            except Exception:  # a dialer that failed the secret's challenge, or dropped
                continue
            try:
                hello = conn.recv() if conn.poll(HELLO_TIMEOUT_S) else None
            except (EOFError, OSError):
                hello = None
            if self._stop.is_set() or not isinstance(hello, Hello):
                conn.close()
                continue
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._arrived, conn, hello)

    def _arrived(self, conn: Connection, hello: Hello) -> None:
        name = hello.name or f"{hello.host}-{hello.pid}"
        replica = self.known.get(name)
        if replica is None:
            replica = self.on_new(name, hello)
            if replica is None:
                conn.close()
                return
            self.known[name] = replica
        log.info("replica %s dialed in from %s (pid %d)", name, hello.host, hello.pid)
        replica.offer(conn, hello)

    def close(self) -> None:
        self._stop.set()
        host, port = self.listener.address
        with contextlib.suppress(Exception):  # wake the blocked accept()
            socket.create_connection(("127.0.0.1" if host in ("0.0.0.0", "") else host, port), timeout=2).close()
        with contextlib.suppress(Exception):
            self.listener.close()
