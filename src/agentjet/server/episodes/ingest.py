"""Ingest: what an episode's calls and its end put into the run. Token-in, token-out at request time
(``tito.py``), each call recorded, and at the end context tracking (calls -> samples) and the durable write,
acknowledged only once the samples are on disk.

An end is idempotent: a retry returns the first acknowledgement with ``duplicate: true``, also after a
restart (the store keeps the key's digest). Team episodes take the same path with ``prepare`` (stored as
PREPARED) and are resolved by ``teams.py``; a committed one comes back through ``TrainingIntake``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from agentjet.engines.base import Engine
from agentjet.protocol import EndEpisodeRequest, EndEpisodeResponse, EpisodeStatus, PrepareEpisodeRequest
from agentjet.runtime.clock import Clock
from agentjet.server.counters import RequestCounters, RunCounters
from agentjet.server.digest import matches
from agentjet.server.episodes.admission import Admission
from agentjet.server.episodes.chat import ChatFormatter
from agentjet.server.episodes.keys import EpisodeKeys
from agentjet.server.episodes.locks import KeyedLocks
from agentjet.server.episodes.registry import Episode, EpisodeRegistry
from agentjet.server.episodes.teams import Teams
from agentjet.server.episodes.tito import TitoSession, may_splice, request_prompt_ids
from agentjet.server.errors import APIError, bad_request, conflict, unavailable
from agentjet.server.store import SampleStore, StoredEpisode, StoredStatus, StoreError
from agentjet.server.store_health import StoreHealth
from agentjet.server.training.loop import TrainLoop
from agentjet.settings import ServerConfig
from agentjet.tracking import CallRecord, EpisodeSample, TrackingReport, track_episode

log = logging.getLogger(__name__)


class TrainingIntake:
    """An episode that is durable and final (ended, or a team episode committed): counted, and handed to the
    train loop when it is a training episode."""

    def __init__(self, loop: TrainLoop, requests: RequestCounters) -> None:
        self.loop = loop
        self.requests = requests

    def acknowledged(self, stored: StoredEpisode) -> None:
        self.requests.episode_ended()
        if stored.status is StoredStatus.PENDING:
            self.loop.add(stored)


class Ingest:
    def __init__(self, config: ServerConfig, engine: Engine, formatter: ChatFormatter, registry: EpisodeRegistry,
                 store: SampleStore, keys: EpisodeKeys, teams: Teams, end_locks: KeyedLocks, clock: Clock,
                 store_health: StoreHealth, intake: TrainingIntake, admission: Admission,
                 counters: RunCounters, adapter_of: Callable[[list[str]], dict[str, str]] | None = None) -> None:
        """``adapter_of(agents)``: agent -> the LoRA adapter that served it (a server with several adapters), so the
        store records which adapters must each consume the episode."""
        self.config = config
        self.engine = engine
        self.formatter = formatter
        self.registry = registry
        self.store = store
        self.keys = keys
        self.teams = teams
        self.end_locks = end_locks  # one end / prepare / commit at a time per episode
        self.clock = clock
        self.store_health = store_health
        self.intake = intake
        self.admission = admission
        self.counters = counters
        self.adapter_of = adapter_of

    # ------------------------------------------------------------------ calls
    async def tito_prompt_ids(self, ep: Episode, agent: str, messages: list[dict[str, Any]],
                              tools: list[dict[str, Any]] | None, plain_ids: list[int]) -> list[int]:
        """Token-in, token-out (``tracking.tito``): the prompt with this agent's earlier generations spliced in
        as generated. Runs in a worker thread (it re-renders the conversation) on a snapshot of the calls."""
        if not self.config.tracking.tito or not may_splice(ep.calls, agent, messages):
            return plain_ids
        if ep.tito is None:  # what the splice carries from one request of the episode to the next
            ep.tito = TitoSession(self.formatter.tokenizer)
        ids, outcome, drift = await asyncio.to_thread(request_prompt_ids, self.formatter, plain_ids, list(ep.calls),
                                                      agent, messages, tools, ep.tito)
        self.counters.tito.count(outcome, drift)
        return ids

    def record_call(self, ep: Episode, call: CallRecord) -> None:
        ep.calls.append(call)
        self.counters.requests.call(generated_tokens=len(call.completion_ids))

    def build_samples(self, calls: list[CallRecord]) -> tuple[list[EpisodeSample], TrackingReport]:
        """Context tracking: drift repair and timeline merging (settings in ``config.tracking``). Tracking
        must never lose an episode: if it fails, fall back to one sample per call from the recorded ids."""
        cfg = self.config.tracking.to_config()
        try:
            return track_episode(calls, self.engine.tokenizer, cfg)
        except Exception:
            log.exception("context tracking failed; using one sample per call")
            return track_episode(calls, None, cfg)

    # ------------------------------------------------------------------ end
    def _check_reward_agents(self, ep: Episode, req: EndEpisodeRequest) -> None:
        if not isinstance(req.reward, dict):
            return
        agents = {c.agent for c in ep.calls}
        missing = agents - set(req.reward)
        unknown = set() if req.ignore_unused_agents else set(req.reward) - agents
        if missing or unknown:
            raise bad_request(
                f"per-agent reward must name exactly the agents that made calls in this episode: {sorted(agents)}"
                + (f"; missing {sorted(missing)}" if missing else "") + (f"; unknown {sorted(unknown)}" if unknown else ""),
                param="reward")

    async def end(self, key: str | None, episode_id: str, req: EndEpisodeRequest) -> EndEpisodeResponse:
        """Store the episode durably, then acknowledge. Idempotent."""
        return await self._store_and_acknowledge(key, episode_id, req, None)

    async def prepare(self, key: str | None, episode_id: str, req: PrepareEpisodeRequest) -> EndEpisodeResponse:
        """Team phase one: store durably as PREPARED (not trainable until commit). Idempotent."""
        return await self._store_and_acknowledge(key, episode_id, req, req)

    async def commit(self, key: str | None, episode_id: str) -> EndEpisodeResponse:
        """Team phase two: a prepared episode becomes trainable. Idempotent."""
        self.keys.authorize_stored(key, episode_id)
        return await self.teams.resolve(episode_id, commit=True)

    def _stored_ack(self, key: str | None, episode_id: str) -> Episode | EndEpisodeResponse:
        """The live episode, or (after a server restart) the acknowledgement of a stored one."""
        try:
            return self.keys.by_key(key, episode_id)
        except APIError:
            stored = self.store.get_episode(episode_id)
            if stored is not None and matches(key, stored.key_hash):
                return EndEpisodeResponse(episode_id=episode_id, status=EpisodeStatus.ENDED, acknowledged=True,
                                          duplicate=True, calls=stored.n_calls, samples=stored.n_samples)
            raise

    def _stored_episode(self, ep: Episode, req: EndEpisodeRequest, calls: list[CallRecord], n_samples: int,
                        team: PrepareEpisodeRequest | None) -> StoredEpisode:
        final = StoredStatus.EVAL if ep.is_eval else StoredStatus.PENDING
        return StoredEpisode(
            episode_id=ep.episode_id, key_hash=ep.key_hash, client_id=ep.client_id, task_id=ep.task_id,
            task_type=ep.task_type, group_key=ep.group_key, reward=req.reward,
            status=StoredStatus.PREPARED if team else final, n_calls=len(calls), n_samples=n_samples,
            begin_policy_version=ep.begin_policy_version,
            min_policy_version=min((c.policy_version for c in calls), default=ep.begin_policy_version),
            max_policy_version=max((v for c in calls for v in (c.policy_version, *c.versions)),
                                   default=ep.begin_policy_version),
            ended_at=self.clock.time(), commit_status=final,
            team_id=team.team_id if team else None, team_coordinator=team.coordinator_url if team else None,
            team_secret=team.team_secret if team else None)

    async def _store_and_acknowledge(self, key: str | None, episode_id: str, req: EndEpisodeRequest,
                                     team: PrepareEpisodeRequest | None) -> EndEpisodeResponse:
        ep = self._stored_ack(key, episode_id)
        if isinstance(ep, EndEpisodeResponse):
            return ep
        async with self.end_locks.hold(episode_id):
            if ep.end_response is not None:  # a retry of an end / prepare we already acknowledged
                return ep.end_response.model_copy(update={"duplicate": True})
            if not ep.is_open:
                raise conflict(f"episode {episode_id} is {ep.status.value}; its calls were discarded",
                               f"episode_{ep.status.value}")
            if ep.inflight:
                raise conflict(f"episode {episode_id} still has {ep.inflight} chat call(s) in flight", "calls_in_flight")
            self._check_reward_agents(ep, req)
            # Pinned while it is stored (like a chat call in flight): otherwise a lease running out during a
            # slow end let the reaper expire the episode and clear its calls under build_samples, and the
            # end was acknowledged with no calls and no samples. A snapshot guards against a rejoin, too.
            calls = list(ep.calls)
            ep.inflight += 1
            try:
                samples, report = await asyncio.to_thread(self.build_samples, calls)
                stored = self._stored_episode(ep, req, calls, len(samples), team)
                adapters = self.adapter_of(sorted({s.agent for s in samples})) if self.adapter_of else None
                await asyncio.to_thread(self.store.commit_episode, stored, samples, req.metadata, report.to_dict(),
                                        adapters)
                self.counters.tracking.add(report.to_dict())  # observe: merge ratio and drift repairs
                if StoredStatus.EVAL not in (stored.status, stored.commit_status):
                    self.counters.levels.noted(stored.task_type, req.metadata)  # the status's levels
            except StoreError as exc:
                log.error("%s", exc)
                self.store_health.failed()  # the episode stays open: the client can retry
                raise unavailable(f"the server could not store the episode durably: {exc}; retry later",
                                  "store_unavailable", retry_after_s=5) from exc
            finally:
                ep.inflight -= 1
            status = EpisodeStatus.PREPARED if team else EpisodeStatus.ENDED
            ep.end_response = EndEpisodeResponse(episode_id=episode_id, status=status, acknowledged=True,
                                                 duplicate=False, calls=len(calls), samples=len(samples))
            ep.calls.clear()
            self.registry.close(ep, status)
            if team:
                self.teams.track(episode_id)
            else:
                self.intake.acknowledged(stored)
            self.admission.pump()
        return ep.end_response
