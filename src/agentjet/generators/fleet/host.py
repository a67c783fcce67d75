"""The replica's side of a replica process (``ajet generator``): dial the server's join address with the fleet's
secret, say ``Hello``, take ``Init``, build the generator it asks for (``build``: the model loaded here), say
``Ready``, then serve the server's calls, weights and pings (``wire.py``) until the server says ``Shutdown`` or the
connection closes (the server is gone: a replica without its server has nothing to do, so the process exits).

Tokens go back as they come, gathered into one ``Tokens`` message per turn of this process's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from agentjet.engines.errors import EngineUnavailableError, GenerationError
from agentjet.generators.fleet.replica import InProcessReplica, Weights
from agentjet.generators.fleet.wire import (
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

log = logging.getLogger(__name__)


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` (or ``tcp://host:port``) -> (host, port)."""
    host, sep, port = address.removeprefix("tcp://").rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"the join address must be HOST:PORT, got {address!r}")
    return host or "127.0.0.1", int(port)


def dial(address: tuple[str, int], token: str, timeout_s: float) -> Connection:
    """Connect to the server's join address, retrying until ``timeout_s`` (a refused secret fails at once)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Client(address, family="AF_INET", authkey=token.encode())
        except (ConnectionRefusedError, ConnectionResetError, TimeoutError, socket.gaierror) as exc:
            if time.monotonic() >= deadline:
                raise ConnectionError(f"no fleet answers at {address[0]}:{address[1]} ({exc})") from exc
            time.sleep(0.5)


class ReplicaHost:
    """Serves one generator (an ``InProcessReplica``: the generator, how it takes weights, how it is pinged) to the
    server over ``link``."""

    def __init__(self, build: Callable[[Init], InProcessReplica], scratch: Path) -> None:
        self.build = build
        self.scratch = scratch
        loop = asyncio.get_running_loop()
        self.init: asyncio.Future[Init] = loop.create_future()
        self.done: asyncio.Future[str] = loop.create_future()
        self.replica: InProcessReplica | None = None
        self.link: Link | None = None
        self._calls: dict[int, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._tokens: list[tuple[int, int, float]] = []

    def on_message(self, msg: object | None) -> None:
        if msg is None:
            _finish(self.done, "the server closed the connection")
        elif isinstance(msg, Init):
            if not self.init.done():
                self.init.set_result(msg)
        elif isinstance(msg, Generate):
            self._calls[msg.call] = self._spawn(self._generate(msg))
        elif isinstance(msg, Cancel):
            task = self._calls.get(msg.call)
            if task is not None:
                task.cancel()
        elif isinstance(msg, WeightChunk):
            with open(self.scratch / f"load-{msg.load}.safetensors", "ab") as f:
                f.write(msg.data)
        elif isinstance(msg, LoadWeights):
            self._spawn(self._load(msg))
        elif isinstance(msg, Ping):
            self._spawn(self._ping(msg))
        elif isinstance(msg, Shutdown):
            _finish(self.done, "the server asked it to stop")

    def _spawn(self, coro: object) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _send(self, msg: object) -> None:
        assert self.link is not None
        with contextlib.suppress(LinkClosed):  # the server is gone: ``done`` ends the process
            self.link.send(msg)

    def _token(self, call: int, token: int, logprob: float) -> None:
        self._tokens.append((call, token, logprob))
        if len(self._tokens) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        if self._tokens:
            items, self._tokens = self._tokens, []
            self._send(Tokens(items))

    async def _generate(self, msg: Generate) -> None:
        assert self.replica is not None
        gen = self.replica.generator
        call = msg.call

        def on_token(token: int, logprob: float) -> None:
            self._token(call, token, logprob)

        try:
            if msg.adapter is None:
                result = await gen.generate(msg.prompt_ids, msg.sampling, on_token)
            else:
                result = await gen.generate(msg.prompt_ids, msg.sampling, on_token, adapter=msg.adapter)
        except asyncio.CancelledError:
            return  # the server gave up on it (its caller went away, or it moved on)
        except GenerationError as exc:
            self._send(Failed(call, "request", str(exc), exc.param))
        except ValueError as exc:
            self._send(Failed(call, "request", str(exc)))
        except EngineUnavailableError as exc:
            self._send(Failed(call, "unavailable", str(exc)))
        except Exception as exc:  # noqa: BLE001 - the replica's failure, reported to the server
            log.exception("call %d failed", call)
            self._send(Failed(call, "error", f"{type(exc).__name__}: {exc}"))
        else:
            self._flush()  # its last tokens before its result
            self._send(Result(call, result))
        finally:
            self._calls.pop(call, None)

    async def _load(self, msg: LoadWeights) -> None:
        assert self.replica is not None
        received = self.scratch / f"load-{msg.load}.safetensors"
        path = Path(msg.path) if msg.path is not None else received
        try:
            await self.replica.load(Weights(msg.version, path))
            self._send(Loaded(msg.load, msg.version))
        except Exception as exc:  # noqa: BLE001 - it keeps serving the previous version; the server decides
            log.exception("loading policy v%d failed", msg.version)
            self._send(Loaded(msg.load, self.replica.version, error=f"{type(exc).__name__}: {exc}"))
        finally:
            received.unlink(missing_ok=True)

    async def _ping(self, msg: Ping) -> None:
        assert self.replica is not None
        await self.replica.ping()  # answered when the engine thread is free: a hung engine never answers
        self._send(Pong(msg.n, self.replica.version, self.replica.generator.counters()))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.replica is not None:
            await self.replica.generator.close()


async def serve_replica(address: str, token: str, name: str | None, build: Callable[[Init], InProcessReplica],
                        connect_timeout_s: float = 120.0) -> str:
    """Dial, join, serve until the server lets go; returns why it ended."""
    conn = await asyncio.to_thread(dial, parse_address(address), token, connect_timeout_s)
    scratch = Path(tempfile.mkdtemp(prefix="agentjet-replica-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                                    else None))
    host = ReplicaHost(build, scratch)
    host.link = Link(conn, asyncio.get_running_loop(), host.on_message, name="replica")
    try:
        host.link.send(Hello(name, socket.gethostname(), os.getpid()))
        first: set[asyncio.Future[Any]] = {host.init, host.done}
        await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        if not host.init.done():
            return host.done.result()
        init = host.init.result()
        log.info("replica %s: loading %s on %s", init.name, init.model, init.device)
        host.replica = await asyncio.to_thread(build, init)
        gen = host.replica.generator
        host._send(Ready(capacity=gen.capacity, max_context=gen.max_context, vocab_size=len(gen.tokenizer),
                         version=host.replica.version, info=gen.describe()))
        log.info("replica %s: ready", init.name)
        return await host.done
    finally:
        await host.close()
        host.link.close()
        shutil.rmtree(scratch, ignore_errors=True)


def _finish(future: asyncio.Future[str], why: str) -> None:
    if not future.done():
        future.set_result(why)
