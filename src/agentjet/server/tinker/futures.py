"""The futures the SDK polls with ``retrieve_future``, and each training client's ``seq_id`` order."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agentjet.runtime.clock import Clock
from agentjet.server.tinker.errors import TinkerError

log = logging.getLogger(__name__)

# A long poll of retrieve_future holds at most this long before answering try_again (the SDK's read timeout is 45 s).
LONG_POLL_S = 30.0
# A finished future is kept this long after it finished (server clock), retrieved or not: a poll retried after the
# client's own timeout gets the same answer; then it is dropped.
FUTURE_KEEP_S = 600.0


@dataclass
class SeqOrder:
    """One training client's request order: its requests run one at a time, in ``seq_id`` order."""

    next_seq: int | None = None  # the seq_id the next request must carry (None: the first sets it)
    turn: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def run(self, seq_id: int, work: Callable[[], Awaitable[Any]]) -> Any:
        """``work`` once every earlier ``seq_id`` has run (or the order was released)."""
        async with self.turn:
            if self.next_seq is None:
                self.next_seq = seq_id
            await self.turn.wait_for(lambda: self.next_seq is None or seq_id <= self.next_seq)
            try:
                return await work()
            finally:
                self.next_seq = max(self.next_seq or 0, seq_id + 1)
                self.turn.notify_all()

    def ahead(self, seq_id: int) -> bool:
        """Whether a request with this ``seq_id`` waits for earlier ones."""
        return self.next_seq is not None and seq_id > self.next_seq

    async def release(self) -> None:
        """The client is gone: requests waiting for a seq_id that will never come now run (and fail: no adapter)."""
        async with self.turn:
            self.next_seq = None
            self.turn.notify_all()


@dataclass
class Future:
    request_id: str
    model_id: str | None
    seq_id: int | None = None  # its place in its model's order (None: runs at once)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: Any = None  # a JSON-able dict, or protobuf bytes
    error: TinkerError | None = None
    finished_at: float | None = None  # the server clock when it finished


class Futures:
    """Work run in the background, each piece a future the SDK polls. ``order_of`` gives a model's ``SeqOrder``
    (None: the model is gone, and its work runs at once)."""

    def __init__(self, clock: Clock, order_of: Callable[[str], SeqOrder | None]) -> None:
        self.clock = clock
        self.order_of = order_of
        self.live: dict[str, Future] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, model_id: str | None, work: Callable[[], Awaitable[Any]], seq_id: int | None = None) -> str:
        """Run ``work`` in the background (in ``seq_id`` order within its model) and return the request id the
        SDK polls with ``retrieve_future``."""
        rid = f"req-{uuid.uuid4().hex}"
        fut = self.live[rid] = Future(rid, model_id, seq_id)
        self.spawn(self._run(fut, work))
        return rid

    async def _run(self, fut: Future, work: Callable[[], Awaitable[Any]]) -> None:
        order = self.order_of(fut.model_id) if fut.model_id else None
        try:
            if order is not None and fut.seq_id is not None:
                fut.result = await order.run(fut.seq_id, work)
            else:
                fut.result = await work()
        except TinkerError as e:
            fut.error = e
        except ValueError as e:
            fut.error = TinkerError(str(e))
        except Exception as e:  # noqa: BLE001 - a fault of the server, reported in the future, not as a 5xx
            log.exception("tinker request %s failed", fut.request_id)
            fut.error = TinkerError(f"{type(e).__name__}: {e}", 500, "server")
        finally:
            fut.finished_at = self.clock.monotonic()
            fut.done.set()

    def find(self, request_id: str) -> Future | None:
        return self.live.get(request_id)

    async def retrieve(self, request_id: str, wait_s: float = LONG_POLL_S) -> Future | None:
        """The finished future, or None after ``wait_s`` on the server's clock (the SDK asks again). A finished one
        answers every retrieve until it expires (``expire``), so a retried poll gets the same answer."""
        fut = self.live.get(request_id)
        if fut is None:
            raise TinkerError(f"unknown request id {request_id!r}", 404)
        if not fut.done.is_set():
            waiter = asyncio.ensure_future(fut.done.wait())
            timer = asyncio.ensure_future(self.clock.sleep(wait_s))
            await asyncio.wait({waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            timer.cancel()
            if not fut.done.is_set():
                return None
        return fut

    def waiting_turn(self, fut: Future) -> bool:
        """The future waits for its turn: its seq_id is ahead of its model's next one (it runs once that comes)."""
        order = self.order_of(fut.model_id) if fut.model_id else None
        return not fut.done.is_set() and order is not None and fut.seq_id is not None and order.ahead(fut.seq_id)

    def expire(self) -> None:
        """Futures that finished more than ``FUTURE_KEEP_S`` ago are dropped, retrieved or not."""
        now = self.clock.monotonic()
        stale = [rid for rid, f in list(self.live.items())
                 if f.finished_at is not None and now - f.finished_at > FUTURE_KEEP_S]
        for rid in stale:
            self.live.pop(rid, None)

    def spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
