"""An event loop on a thread of its own, for a part whose state must live on one loop while its callers run on
others (the rollout fleet, ``generators/fleet``: the server's loop, a benchmark's ``run_blocking`` loops, the
layout being built before any loop runs). Callers await work on it (``call``) or block on it from a thread with
no running loop (``run``); a caller that is cancelled cancels the work."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """One event loop running forever on a daemon thread named ``name`` (started at once)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def here(self) -> bool:
        """Whether the caller runs on this loop (its thread)."""
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` run on this loop, from a coroutine on any loop (this one included). Cancelling the caller
        cancels it."""
        if self.here:
            return await coro
        future = self.submit(coro)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Block until ``coro`` has run on this loop (from a thread that is not this loop's)."""
        if self.here:
            coro.close()
            raise RuntimeError("LoopThread.run was called on its own loop, which it would block: await call()")
        return self.submit(coro).result(timeout)

    def soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Call ``fn(*args)`` on the loop, from any thread."""
        self.loop.call_soon_threadsafe(fn, *args)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the loop after what it is running now and join the thread (idempotent)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self.here:
            return  # the loop stops after this callback; its thread ends with it
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
