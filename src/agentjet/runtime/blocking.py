"""One way to call the async API from synchronous code (tests, benchmarks, scripts, a layout being built):
``run_blocking(engine.close())``, ``run_blocking(learner.train_step(batch))``. The roles have no ``*_sync`` twins."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def _wait(awaitable: Awaitable[T]) -> T:
    return await awaitable


def run_blocking(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to completion on a fresh event loop and return its result. From a thread with no running
    loop only (a worker thread is fine); inside a running loop it would block that loop, so it raises instead:
    ``await`` it there, or hand the blocking caller to ``asyncio.to_thread``."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_wait(awaitable))
    if inspect.iscoroutine(awaitable):
        awaitable.close()  # never started: no "was never awaited" warning on top of the error
    raise RuntimeError("run_blocking was called from a running event loop, which it would block: await the call "
                       "there, or run the blocking caller in a thread (asyncio.to_thread)")
