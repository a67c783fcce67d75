"""The router: each session's calls to one replica (affinity: its prefix stays cached there; consistent hashing
alone thrashed prime-rl's cache when replicas came and went), a new session to the least-loaded replica in
rotation (fewest calls in flight, then fewest sessions), and a session whose replica left rotation to the
least-loaded of the others. Sessions are kept most recent first, at most ``max_sessions`` of them."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence

from agentjet.generators.fleet.counters import RouteKind, RouterCounters
from agentjet.generators.fleet.replica import ReplicaSlot

MAX_SESSIONS = 100_000  # sessions remembered (an episode's calls come within minutes; the oldest are dropped)


class Router:
    def __init__(self, counters: RouterCounters | None = None, max_sessions: int = MAX_SESSIONS) -> None:
        self.counters = counters or RouterCounters()
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, str] = OrderedDict()  # session -> replica name
        self._per_replica: Counter[str] = Counter()

    def sessions_on(self, name: str) -> int:
        return self._per_replica[name]

    def replica_of(self, session: str) -> str | None:
        return self._sessions.get(session)

    def pick(self, session: str | None, serving: Sequence[ReplicaSlot]) -> ReplicaSlot | None:
        """The replica for a call of ``session`` (None: a call of no session) among ``serving`` (in rotation, in
        the fleet's order); None when there is none."""
        if not serving:
            return None
        bound = self._sessions.get(session) if session is not None else None
        if bound is not None:
            hit = next((slot for slot in serving if slot.name == bound), None)
            if hit is not None:
                assert session is not None
                self._sessions.move_to_end(session)
                self.counters.route(RouteKind.AFFINITY)
                return hit
        chosen = min(serving, key=lambda slot: (slot.in_flight, self._per_replica[slot.name]))
        self.counters.route(RouteKind.NEW if bound is None else RouteKind.REBOUND)
        if session is not None:
            self._bind(session, chosen.name)
        return chosen

    def _bind(self, session: str, name: str) -> None:
        old = self._sessions.pop(session, None)
        if old is not None:
            self._per_replica[old] -= 1
        self._sessions[session] = name
        self._per_replica[name] += 1
        while len(self._sessions) > self.max_sessions:
            _, dropped = self._sessions.popitem(last=False)
            self._per_replica[dropped] -= 1

    def forget_replica(self, name: str) -> None:
        """A replica removed from the fleet: its sessions go to the least-loaded one at their next call."""
        self._per_replica.pop(name, None)
