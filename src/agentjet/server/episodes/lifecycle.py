"""The episode lifecycle outside admission and ingest: join (a client's leftovers released), heartbeat (the
lease renewed) and abort (the calls discarded; a prepared team episode resolved as aborted).

The other concerns of an episode have their own places: key auth (``keys.py``), begin with its quotas and
capacity (``admission.py``), calls and the durable end (``ingest.py``), the trace (``observe_source.py``).
"""

from __future__ import annotations

import logging

from agentjet.engines.base import Engine
from agentjet.protocol import (
    AbortEpisodeResponse,
    EpisodeStatus,
    HeartbeatResponse,
    JoinRequest,
    JoinResponse,
)
from agentjet.server.episodes.admission import Admission
from agentjet.server.episodes.keys import EpisodeKeys
from agentjet.server.episodes.registry import EpisodeRegistry
from agentjet.server.episodes.teams import Teams
from agentjet.server.errors import conflict
from agentjet.settings import ServerConfig

log = logging.getLogger(__name__)


class Episodes:
    def __init__(self, config: ServerConfig, engine: Engine, registry: EpisodeRegistry, keys: EpisodeKeys,
                 teams: Teams, admission: Admission) -> None:
        self.config = config
        self.engine = engine
        self.registry = registry
        self.keys = keys
        self.teams = teams
        self.admission = admission

    def join(self, req: JoinRequest) -> JoinResponse:
        released = self.registry.release_client(req.client_id)
        if released:
            log.info("client %s rejoined: released %d open episodes of its earlier process", req.client_id, released)
            self.admission.pump()
        return JoinResponse(client_id=req.client_id, model=self.config.name, policy_version=self.engine.policy_version,
                            lease_seconds=self.config.lease_seconds, released_episodes=released,
                            group_size=self.config.training.group_size,
                            sampling=self.config.sampling.model_dump(mode="json"))

    def heartbeat(self, key: str | None, episode_id: str) -> HeartbeatResponse:
        ep = self.keys.by_key(key, episode_id)
        if not ep.is_open:
            raise conflict(f"episode {episode_id} is {ep.status.value}", f"episode_{ep.status.value}")
        self.registry.touch(ep)
        return HeartbeatResponse(episode_id=episode_id, status=ep.status,
                                 lease_remaining_seconds=self.registry.lease_remaining(ep),
                                 policy_version=self.engine.policy_version)

    async def abort(self, key: str | None, episode_id: str, reason: str) -> AbortEpisodeResponse:
        ep = self.keys.by_key(key, episode_id)
        if ep.status is EpisodeStatus.PREPARED:
            await self.teams.resolve(episode_id, commit=False)
            return AbortEpisodeResponse(episode_id=episode_id, status=EpisodeStatus.ABORTED)
        if ep.status is EpisodeStatus.ENDED:
            raise conflict(f"episode {episode_id} already ended and was acknowledged", "episode_ended")
        if ep.is_open:
            log.info("episode %s aborted by client %s: %s", episode_id, ep.client_id, reason or "(no reason)")
            ep.calls.clear()
            self.registry.close(ep, EpisodeStatus.ABORTED)
            self.admission.pump()
        return AbortEpisodeResponse(episode_id=episode_id, status=ep.status)
