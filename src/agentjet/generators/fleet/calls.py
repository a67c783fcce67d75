"""One call through the fleet, on its loop: routed (``router.py``), sent to its replica with every token kept as it
arrives (``held.py``), and moved on to another replica when its own dies or hangs, from the tokens kept, up to
``retries`` times. The request's own faults (a ``GenerationError``, a ``ValueError``: a 4xx) are not moved: every
replica would refuse them. Any other failure of a live replica moves the call too, without taking the replica out
(the health rule decides that): a request that fails everywhere fails after ``retries`` moves, and a 503 is all a
client sees of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from typing import Any

from agentjet.engines.base import GenerationResult, SamplingParams, TokenCallback
from agentjet.engines.errors import EngineUnavailableError, GenerationError
from agentjet.generators.fleet.held import Held
from agentjet.generators.fleet.replica import ReplicaSlot
from agentjet.generators.fleet.slots import Slots
from agentjet.runtime.clock import Clock

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5.0


class Moved(Exception):
    """The attempt's replica died, hung or failed the call: it goes on elsewhere."""


class Calls:
    def __init__(self, slots: Slots, clock: Clock, tokenizer: Any, stop_ids: Collection[int], retries: int,
                 wait_s: float) -> None:
        """``wait_s``: how long a call waits for a replica in rotation when there is none (a restart)."""
        self.slots = slots
        self.clock = clock
        self.tokenizer = tokenizer
        self.stop_ids = frozenset(stop_ids)
        self.retries = retries
        self.wait_s = wait_s

    async def generate(self, session: str | None, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None, adapter: str | None) -> GenerationResult:
        held = Held()
        moves = 0
        avoid: set[str] = set()
        while True:
            finish = held.finished(sampling, self.stop_ids, self.tokenizer)
            if finish is not None:
                return held.result(None, sampling, self.tokenizer, finish)
            slot = await self.pick(session, avoid)
            prompt, params = held.next_call(prompt_ids, sampling)
            try:
                last = await self.attempt(slot, prompt, params, on_token, adapter, held)
            except Moved as exc:
                kept = held.keep()
                if moves >= self.retries:
                    raise EngineUnavailableError(f"the call failed on {moves + 1} replicas (the last: {exc}); "
                                                 "retry later", RETRY_AFTER_S) from exc
                moves += 1
                self.slots.router.counters.failover(kept)
                avoid.add(slot.name)
                log.info("a call moves on from replica %s with %d tokens kept: %s", slot.name, kept, exc)
                continue
            return held.result(last, sampling, self.tokenizer)

    async def pick(self, session: str | None, avoid: set[str]) -> ReplicaSlot:
        """The replica for the call (a replica it failed on only when no other is in rotation), waiting up to
        ``wait_s`` for one to enter rotation when none is."""
        deadline = self.clock.monotonic() + self.wait_s
        while True:
            serving = self.slots.serving()
            slot = self.slots.router.pick(session, [s for s in serving if s.name not in avoid] or serving)
            if slot is not None:
                return slot
            left = deadline - self.clock.monotonic()
            if left <= 0:
                self.slots.router.counters.no_replica()
                states = ", ".join(f"{s.name} {s.state.value}" for s in self.slots.all()) or "none"
                raise EngineUnavailableError(f"no generator replica is in rotation (replicas: {states}); retry "
                                             "shortly", RETRY_AFTER_S)
            changed = self.slots.changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(left, 1.0))

    async def attempt(self, slot: ReplicaSlot, prompt_ids: list[int], sampling: SamplingParams,
                      on_token: TokenCallback | None, adapter: str | None, held: Held) -> GenerationResult:
        """One attempt on ``slot``; ``Moved`` when the replica left rotation meanwhile or failed the call."""
        held.restart()
        seen = [slot.version]  # the replica's version before the next token arrives

        def got(token: int, logprob: float) -> None:
            held.stream(token, logprob, seen[0])
            seen[0] = slot.version
            slot.heard(self.clock.monotonic())
            if on_token is not None:
                on_token(token, logprob)

        gone = slot.gone
        slot.begin(self.clock.monotonic())
        gen = slot.replica.generator
        call = asyncio.ensure_future(gen.generate(prompt_ids, sampling, got) if adapter is None
                                     else gen.generate(prompt_ids, sampling, got, adapter=adapter))
        try:
            waiting: set[asyncio.Future[Any]] = {call, gone}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if not call.done():
                slot.counters.failed()
                raise Moved(f"replica {slot.name} is out of rotation ({gone.result()})")
            try:
                result = call.result()
            except (GenerationError, ValueError):
                raise  # the request's own fault: a 4xx, on any replica
            except (Exception, asyncio.CancelledError) as exc:
                slot.counters.failed()
                if not slot.replica.alive():
                    self.slots.take_out(slot, f"died during a call ({type(exc).__name__}: {exc})")
                raise Moved(f"replica {slot.name} failed the call: {type(exc).__name__}: {exc}") from exc
            slot.counters.completed(len(result.token_ids))
            return result
        finally:
            if not call.done():
                call.cancel()
            slot.end(self.clock.monotonic())
