"""Multi-model team episodes: the two-phase commit across servers.

Phase one (``prepare``, in ``ingest.py``) stores a team episode durably as PREPARED: not trainable. Phase two
(``commit``) makes it trainable. A prepared episode whose commit never comes (the client died between the
phases) is resolved when its deadline passes: the coordinator server aborts and records the decision; a
participant asks the coordinator (authorised by the team secret) and follows its decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import httpx

from agentjet.protocol import (
    SWARM_PREFIX,
    EndEpisodeResponse,
    EpisodeStatus,
    TeamDecision,
    TeamDecisionResponse,
)
from agentjet.runtime.clock import Clock
from agentjet.server.episodes.locks import KeyedLocks
from agentjet.server.episodes.registry import EpisodeRegistry
from agentjet.server.errors import APIError, conflict
from agentjet.server.store import SampleStore, StoredEpisode, StoredStatus

log = logging.getLogger(__name__)

COMMITTED = (StoredStatus.PENDING, StoredStatus.EVAL, StoredStatus.TRAINED, StoredStatus.DROPPED_STALE,
             StoredStatus.DROPPED_UNIFORM)
COORDINATOR_TIMEOUT_S = 5.0


class Teams:
    def __init__(self, store: SampleStore, registry: EpisodeRegistry, end_locks: KeyedLocks, clock: Clock,
                 lease_seconds: float, on_committed: Callable[[StoredEpisode], None]) -> None:
        self.store = store
        self.registry = registry
        self.end_locks = end_locks
        self.clock = clock
        self.lease_seconds = lease_seconds
        self.on_committed = on_committed  # a committed, trainable episode goes to the trainer
        self.prepared: dict[str, float] = {}  # prepared episode id -> resolution deadline (monotonic)

    def track(self, episode_id: str) -> None:
        """A team episode was prepared: resolve it by itself if its commit does not come in time."""
        self.prepared[episode_id] = self.clock.monotonic() + self.lease_seconds

    def load(self) -> None:
        """Team episodes prepared before a restart."""
        for ep in self.store.prepared_episodes():
            self.track(ep.episode_id)

    async def resolve(self, episode_id: str, commit: bool) -> EndEpisodeResponse:
        """Commit (or abort) a prepared episode. Idempotent."""
        async with self.end_locks.hold(episode_id):
            stored, changed = await asyncio.to_thread(self.store.resolve_prepared, episode_id, commit)
        self.prepared.pop(episode_id, None)
        if stored.status is StoredStatus.PREPARED:  # not resolved: should not happen
            raise conflict(f"episode {episode_id} is still prepared", "episode_prepared")
        committed = stored.status in COMMITTED
        ep = self.registry.get(episode_id)
        if ep is not None:
            ep.status = EpisodeStatus.ENDED if committed else EpisodeStatus.ABORTED
        if changed:
            log.info("team episode %s (team %s) %s", episode_id, stored.team_id, "committed" if committed else "aborted")
            if committed:
                self.on_committed(stored)
        if commit and not committed:
            raise conflict(f"episode {episode_id} was aborted: its team did not commit", "team_aborted")
        if not commit and committed:
            raise conflict(f"episode {episode_id} was already committed", "episode_ended")
        return EndEpisodeResponse(episode_id=episode_id, status=EpisodeStatus.ENDED if committed else
                                  EpisodeStatus.ABORTED, acknowledged=committed, duplicate=not changed,
                                  calls=stored.n_calls, samples=stored.n_samples)

    def decision(self, team_id: str, secret: str | None) -> TeamDecisionResponse:
        """The coordinator's decision for a team, for a participant that holds the team secret."""
        decision = self.store.team_decision(team_id, secret or "")
        return TeamDecisionResponse(team_id=team_id, decision=TeamDecision(decision) if decision
                                    else TeamDecision.UNDECIDED)

    async def resolve_expired(self) -> None:
        """Prepared episodes past their deadline: the coordinator aborts; a participant asks the coordinator."""
        now = self.clock.monotonic()
        for eid, deadline in list(self.prepared.items()):
            if deadline > now:
                continue
            stored = self.store.get_episode(eid)
            if stored is None or stored.status is not StoredStatus.PREPARED:
                self.prepared.pop(eid, None)
                continue
            if stored.team_coordinator is None:
                await self._resolve_quietly(eid, commit=False)
                continue
            decision = await self._ask_coordinator(stored)
            if decision is TeamDecision.UNDECIDED:
                self.prepared[eid] = now + min(5.0, self.lease_seconds)  # ask again later
            else:
                await self._resolve_quietly(eid, commit=decision is TeamDecision.COMMITTED)

    async def _resolve_quietly(self, episode_id: str, commit: bool) -> None:
        with contextlib.suppress(APIError):
            await self.resolve(episode_id, commit)

    async def _ask_coordinator(self, stored: StoredEpisode) -> TeamDecision:
        url = f"{(stored.team_coordinator or '').rstrip('/')}{SWARM_PREFIX}/teams/{stored.team_id}"
        try:
            async with httpx.AsyncClient(timeout=COORDINATOR_TIMEOUT_S) as http:
                r = await http.get(url, headers={"Authorization": f"Bearer {stored.team_secret}"})
            return TeamDecision(r.json()["decision"]) if r.status_code == 200 else TeamDecision.UNDECIDED
        except (httpx.HTTPError, ValueError, KeyError):
            log.warning("team %s: coordinator %s unreachable; episode %s stays prepared", stored.team_id,
                        stored.team_coordinator, stored.episode_id)
            return TeamDecision.UNDECIDED
