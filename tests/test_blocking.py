"""``run_blocking``: the one way synchronous code awaits the async API."""

from __future__ import annotations

import asyncio
import threading
import warnings

import pytest

from agentjet.runtime.blocking import run_blocking


async def double(x: int) -> int:
    await asyncio.sleep(0)
    return 2 * x


def test_runs_a_coroutine_to_its_result_and_raises_its_error() -> None:
    assert run_blocking(double(21)) == 42

    async def fails() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        run_blocking(fails())


def test_runs_in_a_thread_while_another_thread_runs_a_loop() -> None:
    out: list[int] = []

    async def main() -> None:
        t = threading.Thread(target=lambda: out.append(run_blocking(double(4))))
        t.start()
        await asyncio.to_thread(t.join)

    asyncio.run(main())
    assert out == [8]


def test_refuses_a_running_loop_without_leaving_the_coroutine_unawaited() -> None:
    async def main() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a "never awaited" RuntimeWarning would fail here
            with pytest.raises(RuntimeError, match="running event loop"):
                run_blocking(double(1))

    asyncio.run(main())
