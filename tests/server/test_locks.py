"""KeyedLocks: mutual exclusion per key, and no lock left behind (also after an exception)."""

from __future__ import annotations

import asyncio

import pytest

from agentjet.server.episodes.locks import KeyedLocks


def test_same_key_is_exclusive_even_with_three_contenders() -> None:
    locks = KeyedLocks()
    inside: list[int] = []
    overlap = []

    async def worker(i: int) -> None:
        async with locks.hold("ep"):
            inside.append(i)
            overlap.append(len(inside))
            await asyncio.sleep(0.01)
            inside.remove(i)

    async def main() -> None:
        await asyncio.gather(*[worker(i) for i in range(3)])

    asyncio.run(main())
    assert overlap == [1, 1, 1]
    assert len(locks) == 0


def test_different_keys_do_not_block_each_other() -> None:
    locks = KeyedLocks()

    async def main() -> None:
        async with locks.hold("a"):
            await asyncio.wait_for(_enter(locks, "b"), timeout=1)
            assert len(locks) == 1

    asyncio.run(main())
    assert len(locks) == 0


async def _enter(locks: KeyedLocks, key: str) -> None:
    async with locks.hold(key):
        pass


def test_lock_is_dropped_after_an_exception() -> None:
    locks = KeyedLocks()

    async def main() -> None:
        with pytest.raises(RuntimeError):
            async with locks.hold("ep"):
                raise RuntimeError("conflict")

    asyncio.run(main())
    assert len(locks) == 0
