"""What the server and a replica process say to each other, and the connection they say it on.

A replica process (``ajet generator``: on this machine, in a Ray actor, or on a machine that joined by hand)
dials the server's join address and proves the fleet's secret (``multiprocessing.connection``: length-framed
messages, an HMAC challenge on connect with ``generator.fleet.token``, as the trainer group's ranks do). It says
``Hello``, gets ``Init`` (the model and the generator's settings), loads the model and says ``Ready``. Then the
server sends calls (``Generate``, ``Cancel``), weights (``WeightChunk``s then ``LoadWeights``, or a path on shared
storage) and ``Ping``s; the replica answers with ``Tokens`` as they come (a batch per step of its loop),
``Result`` or ``Failed`` per call, ``Loaded`` and ``Pong``. Token ids travel, never text: the server keeps the
chat templates and the tokenizer.

``Link`` is one end of the connection: a sender thread (a send never blocks the event loop; a push's chunks are
sent one at a time, so tokens keep flowing between them) and a receiver thread that hands each message to the
loop. A closed connection reaches the loop as ``None``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from agentjet.engines.base import GenerationResult, SamplingParams

log = logging.getLogger(__name__)

TOKEN_ENV = "AGENTJET_GENERATOR__FLEET__TOKEN"  # the fleet's secret; never on a command line
CHUNK_BYTES = 32 * 1024 * 1024  # a weight file travels in chunks of this size


# ---------------------------------------------------------------- replica -> server
@dataclass(frozen=True)
class Hello:
    name: str | None  # the name the server gave it (a replica it started), or None (joined by hand: named for it)
    host: str
    pid: int


@dataclass(frozen=True)
class Ready:
    capacity: int
    max_context: int
    vocab_size: int
    version: int
    info: dict[str, Any] = field(default_factory=dict)  # its generator's describe()


@dataclass(frozen=True)
class Tokens:
    items: list[tuple[int, int, float]]  # (call id, token id, logprob), in order


@dataclass(frozen=True)
class Result:
    call: int
    result: GenerationResult


@dataclass(frozen=True)
class Failed:
    call: int
    kind: str  # "request" (the call's own fault: a 4xx), "unavailable" or "error" (the replica's)
    message: str
    param: str | None = None


@dataclass(frozen=True)
class Loaded:
    load: int
    version: int
    error: str | None = None  # set when it did not take the weights (it serves the previous version)


@dataclass(frozen=True)
class Pong:
    n: int
    version: int
    counters: dict[str, int]


# ---------------------------------------------------------------- server -> replica
@dataclass(frozen=True)
class Init:
    name: str
    model: str  # a model directory on the server's machine (a joined replica may use its own copy: --model)
    generator: dict[str, Any]  # GeneratorSettings, as JSON
    device: str
    dtype: str
    threads: int | None


@dataclass(frozen=True)
class Generate:
    call: int
    prompt_ids: list[int]
    sampling: SamplingParams
    adapter: str | None = None


@dataclass(frozen=True)
class Cancel:
    call: int


@dataclass(frozen=True)
class WeightChunk:
    load: int
    data: bytes


@dataclass(frozen=True)
class LoadWeights:
    load: int
    version: int
    path: str | None  # a safetensors file or model directory it sees; None: the chunks sent under ``load``


@dataclass(frozen=True)
class Ping:
    n: int


@dataclass(frozen=True)
class Shutdown:
    pass


class LinkClosed(ConnectionError):
    """The connection to the other end is closed."""


class Link:
    """One end of an authenticated connection. ``on_message(msg)`` runs on ``loop`` for each message received, and
    once with None when the connection closes."""

    def __init__(self, conn: Connection, loop: asyncio.AbstractEventLoop,
                 on_message: Callable[[object | None], None], name: str = "link") -> None:
        self.conn = conn
        self.loop = loop
        self.on_message = on_message
        self._out: queue.Queue[tuple[object, asyncio.Future[None] | None] | None] = queue.Queue()
        self.open = True
        threading.Thread(target=self._send_loop, name=f"agentjet-{name}-send", daemon=True).start()
        threading.Thread(target=self._receive_loop, name=f"agentjet-{name}-recv", daemon=True).start()

    def send(self, msg: object) -> None:
        """Queue ``msg`` (from the loop or any thread); raises ``LinkClosed`` once closed."""
        if not self.open:
            raise LinkClosed("the connection is closed")
        self._out.put((msg, None))

    async def send_sent(self, msg: object) -> None:
        """Send ``msg`` and return once it is on the wire (a weight chunk: one at a time in memory)."""
        if not self.open:
            raise LinkClosed("the connection is closed")
        done: asyncio.Future[None] = self.loop.create_future()
        self._out.put((msg, done))
        await done

    def _send_loop(self) -> None:
        while True:
            item = self._out.get()
            if item is None:
                return
            msg, done = item
            try:
                self.conn.send(msg)
            except (OSError, ValueError, EOFError) as exc:
                self._closed_now()
                if done is not None:
                    self.loop.call_soon_threadsafe(_settle, done, LinkClosed(f"send failed: {exc}"))
                return
            if done is not None:
                self.loop.call_soon_threadsafe(_settle, done, None)

    def _receive_loop(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError, ValueError):
                break
            except Exception:  # a message that cannot be unpickled: the other end speaks another version
                log.exception("a message from the other end could not be read; closing the connection")
                break
            self._deliver(msg)
        self._closed_now()
        self._deliver(None)

    def _deliver(self, msg: object | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
            self.loop.call_soon_threadsafe(self.on_message, msg)

    def _closed_now(self) -> None:
        if self.open:
            self.open = False
            self._out.put(None)
            # wake a receiver blocked in recv(), then close
            with contextlib.suppress(OSError, ValueError), socket.socket(fileno=os.dup(self.conn.fileno())) as sock:
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                self.conn.close()

    def close(self) -> None:
        """Close the connection (the other end sees it closed); what is queued is dropped."""
        self._closed_now()


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
