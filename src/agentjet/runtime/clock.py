"""Time, injectable: whatever has a timing rule reads the clock through this, so the rule is tested with a fake
clock instead of sleeps. The server reads ``monotonic()`` and ``time()`` (leases, group timeouts); the client's
train-and-evaluate driver (``agentjet.client.driver``) also waits with ``sleep()``. This is the one clock shape:
the process supervisors, the engine worker, dashboard sessions, the metrics hub and ``ajet research`` take a
``Clock`` too (a blocking wait, where one is needed, is a separate ``sleep`` callable)."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class FakeClock:
    """A clock that moves only when told to (tests): by ``advance``, or by ``sleep``, which moves it at once and
    yields to the event loop once."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1.7e9 + self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)
