"""Health: which replica leaves rotation, and how it comes back.

The rule (``HealthRule``), on the fleet's clock:
- a replica whose process, actor or connection is gone is out at once when a call or a push to it fails that way,
  else at the next check (every ``health_interval_s``);
- a replica that owes an answer (a call in flight, or a ping: an idle replica is pinged at every check) and has
  sent nothing (no token, result or pong) for ``stall_timeout_s`` is out as hung.
So a dead replica is out of rotation within ``health_interval_s``, a hung one within ``stall_timeout_s +
health_interval_s``. Its calls in flight move on to another replica at once (``calls.py``).

Recovery (``Supervisor.recover``): the replica is stopped (what is left of a hung one killed), started again after
a backoff (``restart_backoff_s * 2**(k-1)``, at most 60 s), brought to the newest weights pushed, and put back in
rotation; after ``max_restarts`` restarts it stays out (failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from agentjet.generators.fleet.replica import ReplicaDown, ReplicaSlot, ReplicaState
from agentjet.generators.fleet.slots import Slots
from agentjet.runtime.clock import Clock
from agentjet.settings import FleetSettings

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0


class HealthRule:
    def __init__(self, stall_timeout_s: float) -> None:
        self.stall_timeout_s = stall_timeout_s

    def verdict(self, slot: ReplicaSlot, now: float) -> str | None:
        """Why ``slot`` must leave rotation now, or None."""
        if not slot.serving:
            return None
        if not slot.replica.alive():
            return "died: its process, actor or connection is gone"
        quiet = now - slot.last_heard
        if slot.owes() and quiet >= self.stall_timeout_s:
            return (f"hung: nothing from it for {quiet:.1f} s with {slot.in_flight} call(s) and {slot.pings} "
                    f"ping(s) outstanding (stall_timeout_s {self.stall_timeout_s:g})")
        return None


class Supervisor:
    """Checks every replica each ``health_interval_s`` (pinging the idle ones) and recovers those taken out."""

    def __init__(self, slots: Slots, settings: FleetSettings, clock: Clock) -> None:
        self.slots = slots
        self.settings = settings
        self.clock = clock
        self.rule = HealthRule(settings.stall_timeout_s)
        self._tasks: set[asyncio.Task[None]] = set()
        slots.on_out = self.recover_soon

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            try:
                self.check()
            except Exception:  # one bad pass must not end the watching
                log.exception("the replicas' health check failed; it runs again in the next interval")

    def check(self) -> None:
        """One pass of the rule over every replica; an idle one in rotation gets a ping."""
        now = self.clock.monotonic()
        for slot in self.slots.all():
            reason = self.rule.verdict(slot, now)
            if reason is not None:
                self.slots.take_out(slot, reason)
            elif slot.serving and not slot.owes():
                self._spawn(self._ping(slot))

    async def _ping(self, slot: ReplicaSlot) -> None:
        slot.ping_sent(self.clock.monotonic())
        answered = False
        try:
            await slot.replica.ping()
            answered = True
        except (ReplicaDown, OSError, EOFError) as exc:
            self.slots.take_out(slot, f"died: its ping failed ({exc})")
        finally:
            slot.ping_done(self.clock.monotonic(), answered)

    def recover_soon(self, slot: ReplicaSlot) -> None:
        if slot.recovering is None or slot.recovering.done():
            slot.recovering = self._spawn(self.recover(slot))

    async def recover(self, slot: ReplicaSlot) -> None:
        """Stop it, start it again, catch it up, put it back; after ``max_restarts``, leave it out (failed)."""
        s = self.settings
        with contextlib.suppress(Exception):
            await asyncio.wait_for(slot.replica.stop(), s.startup_timeout_s)
        while slot.state is not ReplicaState.STOPPED:
            if slot.counters.restarts >= s.max_restarts:
                slot.set_state(ReplicaState.FAILED, f"{slot.out_reason}; gave up after {slot.counters.restarts} "
                               "restarts")
                log.error("replica %s stays out of rotation: %s", slot.name, slot.out_reason)
                return
            slot.set_state(ReplicaState.RESTARTING)
            await asyncio.sleep(min(s.restart_backoff_s * 2 ** slot.counters.restarts, MAX_BACKOFF_S))
            slot.counters.restarted()
            try:
                await self.start(slot)
                return
            except Exception as exc:  # noqa: BLE001 - the next restart (or giving up) follows
                log.error("restart %d of replica %s failed: %s", slot.counters.restarts, slot.name, exc)
                slot.out_reason = f"restart {slot.counters.restarts} failed: {exc}"
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(slot.replica.stop(), s.startup_timeout_s)

    async def start(self, slot: ReplicaSlot) -> None:
        """Start a replica (first time or again), bring it to the newest weights, put it in rotation."""
        timeout = slot.replica.start_timeout_s or self.settings.startup_timeout_s
        await asyncio.wait_for(slot.replica.start(), timeout)
        slot.heard(self.clock.monotonic())
        await self.slots.catch_up(slot)
        if slot.state is not ReplicaState.STOPPED:
            self.slots.enter(slot)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
