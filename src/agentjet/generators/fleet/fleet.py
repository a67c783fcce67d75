"""``FleetGenerator``: N generator replicas behind one ``Generator``, the router of the server (design §11).

Its state (``slots.py``: the replicas, the router, the newest weights), its calls (``calls.py``) and its health
(``health.py``) live on an event loop of its own (``runtime/loop_thread.py``), so the fleet serves callers on any
loop (the server's, a benchmark's) and starts its replicas before the server's loop runs. Tokens stream back to the
caller's loop, a few per wake-up.

- ``generate_for(session, ...)``: the session's replica (affinity), a new session on the least-loaded one; a call
  whose replica dies or hangs goes on on another from its tokens (``held.py``);
- ``push(weights)`` (the fleet's seam, ``sync.py``): to every replica in rotation, each timed, one that fails out;
- ``policy_version``: the version every replica in rotation holds;
- ``add(replica)``: a replica that joins while the server runs (``remote.py``);
- ``fleet()``: the replicas and the router's counts, for the status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any

from agentjet.engines.base import GenerationResult, Generator, SamplingParams, TokenCallback
from agentjet.generators.fleet.calls import Calls
from agentjet.generators.fleet.health import Supervisor
from agentjet.generators.fleet.replica import Replica, ReplicaDown, ReplicaState, Weights
from agentjet.generators.fleet.slots import Slots
from agentjet.protocol import FleetStatus
from agentjet.runtime.clock import Clock, SystemClock
from agentjet.runtime.loop_thread import LoopThread
from agentjet.settings import FleetSettings

log = logging.getLogger(__name__)


class TokenRelay:
    """``on_token`` of a caller on another loop: tokens gathered on the fleet's loop, handed over a batch per
    wake-up of the caller's loop (in order, before the call's result: both go through ``call_soon_threadsafe``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_token: TokenCallback) -> None:
        self.loop = loop
        self.on_token = on_token
        self._lock = threading.Lock()
        self._pending: list[tuple[int, float]] = []

    def __call__(self, token: int, logprob: float) -> None:
        with self._lock:
            self._pending.append((token, logprob))
            first = len(self._pending) == 1
        if first:
            self.loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        with self._lock:
            items, self._pending = self._pending, []
        for token, logprob in items:
            self.on_token(token, logprob)


class FleetGenerator(Generator):
    def __init__(self, tokenizer: Any, max_context: int, stop_ids: Collection[int], settings: FleetSettings,
                 replica_kind: str, push_timeout_s: float = 300.0, clock: Clock | None = None) -> None:
        """``replica_kind``: what the replicas run (``hf``, ``vllm``), for the status; ``push_timeout_s``: the
        deadline of one replica's weight push."""
        self._tokenizer = tokenizer
        self._max_context = max_context
        self.settings = settings
        self.replica_kind = replica_kind
        self.clock = clock or SystemClock()
        self.loop = LoopThread("agentjet-fleet")
        self.slots: Slots = self.loop.run(self._make_slots(push_timeout_s))  # its asyncio parts on its loop
        self.supervisor = Supervisor(self.slots, settings, self.clock)
        self.calls = Calls(self.slots, self.clock, tokenizer, stop_ids, settings.retries, settings.startup_timeout_s)
        self._watch: asyncio.Task[None] | None = None
        self.on_close: list[Callable[[], object]] = []  # what else the fleet owns (a join listener, Ray)

    async def _make_slots(self, push_timeout_s: float) -> Slots:
        return Slots(self.clock, push_timeout_s)

    # ------------------------------------------------------------------ the Generator face
    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def capacity(self) -> int:
        total = 0
        for slot in self.slots.serving():
            with contextlib.suppress(ReplicaDown):  # it left rotation since
                total += slot.replica.generator.capacity
        return total or 1

    @property  # the base class declares a plain attribute; here it is the replicas'
    def policy_version(self) -> int:
        """The version every replica in rotation holds (``Slots.served_version``)."""
        return self.slots.served_version()

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        raise AttributeError("a fleet's policy version is its replicas': push weights to them (FleetSync)")

    def counters(self) -> dict[str, int]:
        """The counters of the replicas in rotation, summed (a remote replica's as of its last pong)."""
        out: dict[str, int] = {}
        for slot in self.slots.serving():
            try:
                own = slot.replica.generator.counters()
            except ReplicaDown:  # it left rotation since
                continue
            for key, value in own.items():
                out[key] = out.get(key, 0) + value
        return out

    def describe(self) -> dict[str, Any]:
        slots = self.slots.all()
        return {"kind": "fleet", "replica_kind": self.replica_kind, "replicas": len(slots),
                "serving": len(self.slots.serving()), "where": {s.name: s.replica.where() for s in slots},
                "stall_timeout_s": self.settings.stall_timeout_s,
                "health_interval_s": self.settings.health_interval_s}

    def fleet(self) -> FleetStatus:
        router = self.slots.router
        c = router.counters
        return FleetStatus(replicas=[slot.status(router.sessions_on(slot.name)) for slot in self.slots.all()],
                           serving=len(self.slots.serving()), routed_calls=c.routed, affinity_hits=c.affinity_hits,
                           new_sessions=c.new_sessions, rebound_sessions=c.rebound_sessions, failovers=c.failovers,
                           failover_tokens=c.failover_tokens, unavailable=c.unavailable)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None, adapter: str | None = None) -> GenerationResult:
        return await self.generate_for(None, prompt_ids, sampling, on_token, adapter)

    async def generate_for(self, session: str | None, prompt_ids: list[int], sampling: SamplingParams,
                           on_token: TokenCallback | None = None, adapter: str | None = None) -> GenerationResult:
        relay = on_token if on_token is None or self.loop.here else TokenRelay(asyncio.get_running_loop(), on_token)
        return await self.loop.call(self.calls.generate(session, prompt_ids, sampling, relay, adapter))

    # ------------------------------------------------------------------ replicas and weights
    def start(self, replicas: Sequence[Replica]) -> None:
        """Start ``replicas`` (blocking: at build time) and the health watch; raises when one cannot start."""
        self.loop.run(self._start(list(replicas)))

    async def _start(self, replicas: list[Replica]) -> None:
        slots = [self.slots.add(r) for r in replicas]
        results = await asyncio.gather(*(self.supervisor.start(slot) for slot in slots), return_exceptions=True)
        failed = [f"{slot.name}: {type(r).__name__}: {r}" for slot, r in zip(slots, results, strict=True)
                  if isinstance(r, BaseException)]
        if failed:
            await asyncio.gather(*(slot.replica.stop() for slot in slots), return_exceptions=True)
            raise RuntimeError("generator replicas did not start: " + "; ".join(failed))
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self.supervisor.watch())

    async def add(self, replica: Replica) -> None:
        """A replica that joins while the fleet runs: started, caught up, then in rotation (on the fleet's
        loop)."""
        await self.loop.call(self._add(replica))

    async def _add(self, replica: Replica) -> None:
        slot = self.slots.add(replica)
        try:
            await self.supervisor.start(slot)
        except Exception as exc:
            self.slots.take_out(slot, f"could not start: {type(exc).__name__}: {exc}")
            raise

    async def push(self, weights: Weights) -> dict[str, float]:
        """Push ``weights`` to every replica in rotation (``Slots.push``)."""
        return await self.loop.call(self.slots.push(weights))

    def check(self) -> None:
        """One health pass now (the watch runs one every ``health_interval_s``), from any thread."""
        self.loop.run(self._check())

    async def _check(self) -> None:
        self.supervisor.check()

    async def close(self) -> None:
        if self.loop.loop.is_closed():
            return
        await self.loop.call(self._close())
        for fn in self.on_close:
            fn()
        self.loop.close()

    async def _close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        await self.supervisor.close()
        slots = self.slots.all()
        for slot in slots:
            slot.set_state(ReplicaState.STOPPED, "the fleet closed")
        await asyncio.gather(*(slot.replica.stop() for slot in slots), return_exceptions=True)
