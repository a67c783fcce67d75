"""One replica of the fleet, as the fleet sees it: the ``Replica`` handle (where its calls go and how it is kept
alive: started, checked, pinged, loaded with weights, stopped) and the ``ReplicaSlot`` the fleet keeps for it (its
state, the calls it owes, when it was last heard from, its counters).

Kinds of replica: an embedded generator in the server's process (``InProcessReplica``: tests; also what a replica
process serves, ``host.py``), an engine process or a vLLM server on this machine (``layouts/fleet.py``), a replica
process in a Ray actor (``ray_replicas.py``), a machine that joined by hand (``remote.py: JoinedReplica``)."""

from __future__ import annotations

import abc
import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from agentjet.engines.base import Generator, TrainSample
from agentjet.generators.fleet.counters import ReplicaCounters
from agentjet.protocol import ReplicaStatus

Scorer = Callable[[list[TrainSample]], Awaitable[list[list[float]]]]


class ReplicaState(enum.StrEnum):
    STARTING = "starting"  # started, not yet holding the served weights
    SERVING = "serving"  # in rotation: new calls may go to it
    OUT = "out"  # taken out of rotation (died, hung, a push failed): a restart is due
    RESTARTING = "restarting"
    FAILED = "failed"  # out for good: its restarts are used up
    STOPPED = "stopped"  # closed with the fleet, or removed


class ReplicaDown(RuntimeError):
    """The replica cannot serve: its process, actor or connection is gone, or it did not answer in time."""


@dataclass(frozen=True)
class Weights:
    """A version of the policy for the replicas: a model directory (the learner's export) and the learner's scorer
    (for a replica that checks what it loaded against the learner: vLLM's probe)."""

    version: int
    path: Path
    score: Scorer | None = None


class Replica(abc.ABC):
    """How the fleet reaches one replica. ``start`` (also a restart) returns once the replica takes calls at the
    weights it loaded itself (version 0: the model's); ``load`` brings it to a pushed version."""

    name: str
    start_timeout_s: float | None = None  # None: the fleet's startup_timeout_s

    @property
    @abc.abstractmethod
    def generator(self) -> Generator:
        """Where its calls go (valid once started)."""

    @abc.abstractmethod
    def where(self) -> str:
        """Where it runs, for the status."""

    @abc.abstractmethod
    def alive(self) -> bool:
        """Its process, actor or connection is alive (cheap, never blocks)."""

    @abc.abstractmethod
    async def ping(self) -> None:
        """Returns when the replica answers (raises ``ReplicaDown`` when it cannot)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Start it, or start it again after it died or hung (a fresh process, actor or connection)."""

    @abc.abstractmethod
    async def load(self, weights: Weights) -> None:
        """Bring it to ``weights`` (a push, or a catch-up after a restart); raises when it did not take them."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop it (kill what is left of a hung one). Idempotent."""

    @property
    def version(self) -> int:
        return self.generator.policy_version


class InProcessReplica(Replica):
    """A generator in the server's own process (tests; the measurement baseline). It cannot die on its own.
    ``load(path, version)``: how it takes weights (the embedded engine's ``load_weights``); ``ping``: a call that
    returns when it answers (the embedded engine: a no-op job on its torch thread, which a hung thread never
    runs)."""

    def __init__(self, name: str, generator: Generator, load: Callable[[Path, int], Awaitable[None]] | None = None,
                 ping: Callable[[], Awaitable[None]] | None = None) -> None:
        self.name = name
        self._generator = generator
        self._load = load
        self._ping = ping
        self._stopped = False

    @property
    def generator(self) -> Generator:
        return self._generator

    def where(self) -> str:
        return "in the server's process"

    def alive(self) -> bool:
        return not self._stopped

    async def ping(self) -> None:
        if self._ping is not None:
            await self._ping()

    async def start(self) -> None:
        await self.ping()  # it takes calls once it answers
        self._stopped = False

    async def load(self, weights: Weights) -> None:
        if self._load is None:
            raise ReplicaDown(f"replica {self.name} ({type(self._generator).__name__}) takes no weights")
        await self._load(weights.path, weights.version)

    async def stop(self) -> None:
        self._stopped = True


class ReplicaSlot:
    """The fleet's record of one replica: its state, the calls and pings it owes, when it was last heard from (any
    token, result or pong), its counters. Changed on the fleet's loop only."""

    def __init__(self, replica: Replica, now: float) -> None:
        self.replica = replica
        self.name = replica.name
        self.state = ReplicaState.STARTING
        self.in_flight = 0
        self.pings = 0
        self.last_heard = now
        self.out_reason: str | None = None
        self.counters = ReplicaCounters()
        self.recovering: asyncio.Task[None] | None = None
        self.gone: asyncio.Future[str] = asyncio.get_running_loop().create_future()  # resolved when taken out

    @property
    def serving(self) -> bool:
        return self.state is ReplicaState.SERVING

    @property
    def version(self) -> int:
        return self.replica.version if self.state is not ReplicaState.STOPPED else 0

    def owes(self) -> int:
        """Answers it owes: calls in flight and pings."""
        return self.in_flight + self.pings

    def heard(self, now: float) -> None:
        self.last_heard = now

    def _owed_from(self, now: float) -> None:
        """An answer is owed from now: from an idle replica, the wait for it starts now."""
        if not self.owes():
            self.last_heard = now

    def begin(self, now: float) -> None:
        """A call goes to it."""
        self._owed_from(now)
        self.in_flight += 1

    def end(self, now: float) -> None:
        self.in_flight -= 1
        self.last_heard = now

    def ping_sent(self, now: float) -> None:
        self._owed_from(now)
        self.pings += 1

    def ping_done(self, now: float, answered: bool) -> None:
        self.pings -= 1
        if answered:
            self.last_heard = now

    def set_state(self, state: ReplicaState, reason: str | None = None) -> None:
        """Move to ``state``; leaving rotation resolves ``gone`` (its calls move on) with ``reason``; entering it
        makes a fresh ``gone``."""
        if state is ReplicaState.SERVING and not self.serving:
            self.gone = asyncio.get_running_loop().create_future()
        elif self.serving and state is not ReplicaState.SERVING and not self.gone.done():
            self.gone.set_result(reason or state.value)
        if reason is not None:
            self.out_reason = reason
        self.state = state

    def status(self, sessions: int) -> ReplicaStatus:
        c = self.counters
        return ReplicaStatus(name=self.name, state=self.state.value, where=self.replica.where(),
                             policy_version=self.version, in_flight=self.in_flight, sessions=sessions, calls=c.calls,
                             tokens=c.tokens, failed_calls=c.failed_calls, restarts=c.restarts, pushes=c.pushes,
                             push_failures=c.push_failures, last_push_s=c.last_push_s, push_s_total=c.push_s_total,
                             out_reason=self.out_reason)
