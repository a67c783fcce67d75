"""The serving gate: closed while new weights are swapped in, so new requests wait (up to ``timeout_s``) and
never start on half-swapped weights. The gate is shared by every event loop that generates (a server's, a
benchmark's): each loop gets its own event, and opening or closing reaches all of them."""

from __future__ import annotations

import asyncio

from agentjet.engines.errors import EngineUnavailableError

RETRY_AFTER_S = 30.0


class ServingGate:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._closed = False
        self._events: dict[asyncio.AbstractEventLoop, asyncio.Event] = {}

    @property
    def closed(self) -> bool:
        """Whether a swap holds generation now."""
        return self._closed

    def event(self) -> asyncio.Event:
        """This loop's event (set: open)."""
        loop = asyncio.get_running_loop()
        ev = self._events.get(loop)
        if ev is None:
            for old in [lp for lp in self._events if lp.is_closed()]:
                del self._events[old]
            ev = asyncio.Event()
            if not self._closed:
                ev.set()
            self._events[loop] = ev
        return ev

    def set(self, serving: bool) -> None:
        """Open or close the gate on every loop. The calling loop's event changes at once, so that a request
        that this loop runs next cannot slip past a gate that is closing; other loops change on their next turn."""
        self._closed = not serving
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, ev in list(self._events.items()):
            if loop.is_closed():
                continue
            if loop is current:
                ev.set() if serving else ev.clear()
            else:
                loop.call_soon_threadsafe(ev.set if serving else ev.clear)

    async def wait(self) -> None:
        """Until the gate is open; an unavailable error after ``timeout_s``."""
        ev = self.event()
        if not ev.is_set():
            try:
                await asyncio.wait_for(ev.wait(), self.timeout_s)
            except TimeoutError as exc:
                raise EngineUnavailableError("a weight swap has held generation for more than "
                                             f"{self.timeout_s:.0f}s", RETRY_AFTER_S) from exc
