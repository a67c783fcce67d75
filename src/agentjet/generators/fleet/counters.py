"""The fleet's counters: the router's and each replica's. As in the server's read model (``server/counters.py``),
every counter is written in exactly one method of its object; the status, the dashboard and Prometheus read them
through ``FleetGenerator.fleet()`` (a ``protocol.FleetStatus``, in the run's one snapshot)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RouteKind(enum.StrEnum):
    AFFINITY = "affinity"  # a session's call, to the replica that served its earlier calls
    NEW = "new"  # a new session (or a call without one), to the least-loaded replica
    REBOUND = "rebound"  # a session whose replica left rotation, to the least-loaded one


@dataclass
class RouterCounters:
    """How calls were routed, since start."""

    routed: int = 0
    affinity_hits: int = 0
    new_sessions: int = 0
    rebound_sessions: int = 0
    failovers: int = 0  # calls that went on on another replica after theirs died or hung
    failover_tokens: int = 0  # tokens generated before those failovers, kept: each call went on from them
    unavailable: int = 0  # calls that found no replica in rotation in time (answered 503)

    def route(self, kind: RouteKind) -> None:
        self.routed += 1
        if kind is RouteKind.AFFINITY:
            self.affinity_hits += 1
        elif kind is RouteKind.NEW:
            self.new_sessions += 1
        else:
            self.rebound_sessions += 1

    def failover(self, held_tokens: int) -> None:
        self.failovers += 1
        self.failover_tokens += held_tokens

    def no_replica(self) -> None:
        self.unavailable += 1


@dataclass
class ReplicaCounters:
    """One replica's work, since it was added (its restarts included)."""

    calls: int = 0  # calls it completed
    tokens: int = 0  # tokens it generated for them
    failed_calls: int = 0  # calls it did not complete (each went on elsewhere, or failed as the request's own fault)
    restarts: int = 0
    pushes: int = 0  # weight pushes it took
    push_failures: int = 0
    last_push_s: float = 0.0
    push_s_total: float = 0.0

    def completed(self, tokens: int) -> None:
        self.calls += 1
        self.tokens += tokens

    def failed(self) -> None:
        self.failed_calls += 1

    def restarted(self) -> None:
        self.restarts += 1

    def pushed(self, seconds: float) -> None:
        self.pushes += 1
        self.last_push_s = seconds
        self.push_s_total += seconds

    def push_failed(self) -> None:
        self.push_failures += 1
