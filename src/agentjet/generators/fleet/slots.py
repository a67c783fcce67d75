"""The fleet's replicas, on its loop: one ``ReplicaSlot`` each (state, calls owed, counters), the router, the newest
weights pushed (``latest``: what a replica that restarts or joins catches up to before it serves), and the two
operations that change a replica's weights or rotation: a push to every replica in rotation (each timed; one that
fails takes that replica out, the others go on) and a replica taken out (its calls move on, its recovery starts).

The served version is the version every replica in rotation holds: the lowest of theirs (``served_version``). A
replica enters rotation only holding ``latest``, so a version is served once every replica in rotation took it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from agentjet.generators.fleet.replica import Replica, ReplicaSlot, ReplicaState, Weights
from agentjet.generators.fleet.router import Router
from agentjet.runtime.clock import Clock

log = logging.getLogger(__name__)


class WeightPushFailed(RuntimeError):
    """No replica in rotation took a pushed version (it stays the one they catch up to)."""


class Slots:
    def __init__(self, clock: Clock, push_timeout_s: float) -> None:
        self.clock = clock
        self.push_timeout_s = push_timeout_s
        self.slots: dict[str, ReplicaSlot] = {}
        self.router = Router()
        self.latest: Weights | None = None
        self.changed = asyncio.Event()  # set whenever a replica enters rotation (calls waiting for one wake up)
        self.on_out: Callable[[ReplicaSlot], None] = lambda slot: None  # the supervisor's: start its recovery
        self._last_served = 0

    # ------------------------------------------------------------------ the replicas
    def add(self, replica: Replica) -> ReplicaSlot:
        if replica.name in self.slots and self.slots[replica.name].state is not ReplicaState.STOPPED:
            raise ValueError(f"a replica named {replica.name!r} is in the fleet already")
        slot = ReplicaSlot(replica, self.clock.monotonic())
        self.slots[replica.name] = slot
        return slot

    def all(self) -> list[ReplicaSlot]:
        return list(self.slots.values())

    def serving(self) -> list[ReplicaSlot]:
        return [slot for slot in list(self.slots.values()) if slot.serving]

    def served_version(self) -> int:
        """The version every replica in rotation holds (with none in rotation, the last such version)."""
        versions = [slot.version for slot in self.serving()]
        if versions:
            self._last_served = min(versions)
        return self._last_served

    def enter(self, slot: ReplicaSlot) -> None:
        """``slot`` holds ``latest`` and takes calls from now."""
        slot.set_state(ReplicaState.SERVING)
        self.changed.set()
        self.changed = asyncio.Event()
        log.info("replica %s (%s) serves policy v%d", slot.name, slot.replica.where(), slot.version)

    def take_out(self, slot: ReplicaSlot, reason: str) -> None:
        """Out of rotation at once: its calls in flight move on to another replica, and its recovery starts."""
        if slot.state in (ReplicaState.SERVING, ReplicaState.STARTING):
            log.warning("replica %s (%s) is out of rotation: %s", slot.name, slot.replica.where(), reason)
            slot.set_state(ReplicaState.OUT, reason)
            self.on_out(slot)

    # ------------------------------------------------------------------ weights
    async def load(self, slot: ReplicaSlot, weights: Weights) -> float:
        """Bring one replica to ``weights`` (within the push deadline), timed and counted."""
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(slot.replica.load(weights), self.push_timeout_s)
        except Exception:
            slot.counters.push_failed()
            raise
        seconds = time.perf_counter() - t0
        slot.counters.pushed(seconds)
        return seconds

    async def catch_up(self, slot: ReplicaSlot) -> None:
        """Bring a replica that (re)started to ``latest`` (again if a push moved it meanwhile)."""
        while (weights := self.latest) is not None and slot.replica.version != weights.version:
            await self.load(slot, weights)

    async def push(self, weights: Weights) -> dict[str, float]:
        """Push ``weights`` to every replica in rotation at once. One that fails is taken out (it catches up when
        it is back); the push fails only when no replica in rotation took it."""
        self.latest = weights
        targets = self.serving()
        results: list[Any] = await asyncio.gather(*(self.load(slot, weights) for slot in targets),
                                                  return_exceptions=True)
        metrics: dict[str, float] = {}
        failed = 0
        for slot, result in zip(targets, results, strict=True):
            if isinstance(result, BaseException):
                failed += 1
                self.take_out(slot, f"the push of policy v{weights.version} failed: "
                                    f"{type(result).__name__}: {result}")
            else:
                metrics[f"replica_push_s/{slot.name}"] = result
        if targets and failed == len(targets):
            raise WeightPushFailed(f"no replica took policy v{weights.version} ({failed} failed)")
        pushed = [v for k, v in metrics.items()]
        return {**metrics, "replicas_pushed": float(len(pushed)), "replica_push_failures": float(failed),
                "replica_push_max_s": max(pushed, default=0.0)}
