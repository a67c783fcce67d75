"""The episode lifecycle: join, begin (with cocktail quotas), calls recorded, heartbeat, end (store durably,
then acknowledge), abort, and the token-level trace of a stored episode.

An end is idempotent: a retry returns the first acknowledgement with ``duplicate: true``, also after a
restart (the store keeps the key's digest). Team episodes take the same path with ``prepare`` (stored as
PREPARED) and are resolved by ``teams.py``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from agentjet.engines.base import Engine
from agentjet.observe.events import TrackingTotals
from agentjet.protocol import (
    AbortEpisodeResponse,
    BeginEpisodeRequest,
    BeginEpisodeResponse,
    EndEpisodeRequest,
    EndEpisodeResponse,
    EpisodeStatus,
    HeartbeatResponse,
    JoinRequest,
    JoinResponse,
    PrepareEpisodeRequest,
)
from agentjet.server.admission import AdmissionQueue, Decision, Waiter, admits, capacity, reserved
from agentjet.server.chat import ChatFormatter
from agentjet.server.clock import Clock
from agentjet.server.digest import matches
from agentjet.server.errors import (
    APIError,
    bad_request,
    conflict,
    unavailable,
)
from agentjet.server.keys import EpisodeKeys
from agentjet.server.locks import KeyedLocks
from agentjet.server.registry import Episode, EpisodeRegistry
from agentjet.server.state import ServerState
from agentjet.server.store import SampleStore, StoredEpisode, StoredStatus, StoreError
from agentjet.server.teams import Teams
from agentjet.server.throughput import Throughput
from agentjet.server.tito import TitoCounters, may_splice, request_prompt_ids
from agentjet.server.trainer import Trainer
from agentjet.settings import ServerConfig
from agentjet.tracking import CallRecord, EpisodeSample, TrackingReport, track_episode

log = logging.getLogger(__name__)

QUOTA_RETRY_MS = 500
CAPACITY_RETRY_MS = 250


class Episodes:
    def __init__(self, config: ServerConfig, engine: Engine, formatter: ChatFormatter, registry: EpisodeRegistry,
                 store: SampleStore, trainer: Trainer, teams: Teams, throughput: Throughput, tito: TitoCounters,
                 end_locks: KeyedLocks, clock: Clock, state: Callable[[], ServerState],
                 tracking_totals: TrackingTotals) -> None:
        self.config = config
        self.engine = engine
        self.formatter = formatter
        self.registry = registry
        self.store = store
        self.trainer = trainer
        self.teams = teams
        self.throughput = throughput
        self.tito = tito
        self.end_locks = end_locks  # one end / prepare / commit at a time per episode
        self.clock = clock
        self.state = state
        self.tracking_totals = tracking_totals
        self.keys = EpisodeKeys(registry, store)  # key auth, one concern of its own
        self.store_healthy = True  # False after a failed write, until a probe succeeds
        self.admission_refusals = 0  # begins refused at capacity (admission within the staleness bound)
        self.admission_queue: AdmissionQueue[BeginEpisodeRequest, BeginEpisodeResponse] = AdmissionQueue()
        self.admission_held = 0  # begins that waited on the server before they were admitted

    # ------------------------------------------------------------------ join / begin
    def join(self, req: JoinRequest) -> JoinResponse:
        released = self.registry.release_client(req.client_id)
        if released:
            log.info("client %s rejoined: released %d open episodes of its earlier process", req.client_id, released)
            self.pump_admission()
        return JoinResponse(client_id=req.client_id, model=self.config.name, policy_version=self.engine.policy_version,
                            lease_seconds=self.config.lease_seconds, released_episodes=released,
                            group_size=self.config.training.group_size,
                            sampling=self.config.sampling.model_dump(mode="json"))

    def _check_store(self) -> None:
        if self.store_healthy:
            return
        try:
            self.store.probe()
        except StoreError as exc:
            raise unavailable(f"{exc}; the server accepts no new episodes until its store can be written "
                              "(disk full or read-only?)", "store_unavailable", retry_after_s=10) from exc
        self.store_healthy = True

    async def begin(self, req: BeginEpisodeRequest,
                    client_gone: Callable[[], Awaitable[object]] | None = None) -> BeginEpisodeResponse:
        """Begin an episode. A training episode beyond capacity is held until its group fits, for at most its
        wait (``admission.py``), then answered 429 ``at_capacity``. ``client_gone`` returns when the client
        disconnects: a held begin then leaves the queue (or, admitted in that instant, is aborted)."""
        self._check_open(req)
        wait_s = self._wait_s(req)
        group_key = req.group_id or req.task_id
        if req.eval or not self.config.training.admission or wait_s <= 0:
            if not req.eval:
                self._check_quota(req.task_type)
                self._check_capacity(group_key)
            return self._admit(req)
        self._check_task_type(req.task_type)
        if self._begun_in_group(group_key) % self.config.training.group_size:
            return self._admit(req)  # its group is begun: its place is held
        waiter = self.admission_queue.join(req, group_key, self.clock.monotonic() + wait_s)
        self.pump_admission()
        if waiter.future.done():
            return waiter.future.result()
        self.admission_held += 1
        gone = asyncio.ensure_future(client_gone()) if client_gone is not None else None
        try:
            await asyncio.wait([waiter.future, *([gone] if gone else [])], return_when=asyncio.FIRST_COMPLETED)
            if gone is not None and gone.done():  # (admitted in the same instant: _withdraw aborts it)
                raise APIError(499, "the client went away while its begin was held", code="client_gone")
            return waiter.future.result()
        except BaseException:
            self._withdraw(waiter)
            raise
        finally:
            if gone is not None:
                gone.cancel()

    def _withdraw(self, waiter: Waiter[BeginEpisodeRequest, BeginEpisodeResponse]) -> None:
        """A held begin ends without an answer reaching its client: out of the queue, or, if it was admitted in
        that instant, its episode aborted, so that no place stays taken by a client that is gone."""
        if self.admission_queue.leave(waiter):
            self.pump_admission()  # the head of the queue may have changed
            return
        fut = waiter.future
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            ep = self.registry.get(fut.result().episode_id)
            if ep is not None and ep.is_open:
                log.info("episode %s aborted: its client went away as it was admitted", ep.episode_id)
                self.registry.close(ep, EpisodeStatus.ABORTED)
                self.pump_admission()

    def _wait_s(self, req: BeginEpisodeRequest) -> float:
        most = self.config.training.admission_wait_s
        return most if req.wait_s is None else min(req.wait_s, most)

    def _check_open(self, req: BeginEpisodeRequest) -> None:
        """What refuses a begin whatever the capacity: the server's state, its store, the client's own limit."""
        state = self.state()
        if state is not ServerState.READY:
            raise unavailable(f"the server is {state.value}", "not_ready", retry_after_s=1)
        self._check_store()
        cap = self.config.max_open_episodes_per_client
        if self.registry.open_for_client(req.client_id) >= cap:
            raise APIError(429, f"client {req.client_id!r} already has {cap} open episodes (the limit); end or "
                           "abort some first", "rate_limit_error", code="too_many_open_episodes",
                           headers={"Retry-After": "1"})

    def _admit(self, req: BeginEpisodeRequest) -> BeginEpisodeResponse:
        if not req.eval and not self._begun_in_group(req.group_id or req.task_id) % self.config.training.group_size:
            self.trainer.note_admitted(req.group_id or req.task_id)
        ep, key = self.registry.begin(req, self.engine.policy_version)
        self.trainer.note_begin(req.task_type)
        return BeginEpisodeResponse(episode_id=ep.episode_id, api_key=key, base_url=self.config.base_url(),
                                    lease_seconds=self.config.lease_seconds, policy_version=self.engine.policy_version)

    def _admit_held(self, req: BeginEpisodeRequest) -> BeginEpisodeResponse:
        self._check_open(req)
        return self._admit(req)

    def _decide(self, req: BeginEpisodeRequest) -> Decision:
        """For the queue: may this held begin go now (``admission.py``)?"""
        t = self.config.training
        if self._ahead_of_share(req.task_type):
            return Decision.PASS
        group_key = req.group_id or req.task_id
        if not t.admission or admits(capacity_now=self.capacity() - self.reserved(), group_size=t.group_size,
                                     begun_in_group=self._begun_in_group(group_key)):
            return Decision.ADMIT
        return Decision.BLOCK

    def pump_admission(self) -> None:
        """Capacity may have changed (an episode closed, a step trained, settings changed): admit what fits now,
        and answer the held begins whose wait is over."""
        state = self.state()
        if state is not ServerState.READY:  # stopping: answer every held begin now
            self.admission_queue.expire(math.inf, lambda _: unavailable(f"the server is {state.value}", "not_ready",
                                                                        retry_after_s=1))
            return
        self.admission_queue.expire(self.clock.monotonic(), self._held_too_long)
        self.admission_queue.release(self._decide, self._admit_held)

    def _held_too_long(self, req: BeginEpisodeRequest) -> APIError:
        """The answer to a begin held for its whole wait: ask again at once (another long poll)."""
        if self._ahead_of_share(req.task_type):
            return self._deferred(req.task_type, 0)
        self.admission_refusals += 1
        return self._at_capacity(0)

    def _deferred(self, task_type: str, retry_ms: int) -> APIError:
        share = self.config.training.task_ratios[task_type]
        return APIError(429, f"task type {task_type!r} is ahead of its share ({share} of each batch): retry after "
                        f"{retry_ms} ms", "rate_limit_error", param="task_type", code="deferred",
                        headers={"Retry-After": "1", "Retry-After-Ms": str(retry_ms)})

    def _at_capacity(self, retry_ms: int) -> APIError:
        return APIError(429, f"the swarm is at capacity for policy v{self.engine.policy_version}: an episode begun now "
                        f"would be more than max_staleness={self.config.training.max_staleness} versions old when "
                        f"trained; retry after {retry_ms} ms", "rate_limit_error", code="at_capacity",
                        headers={"Retry-After": "1", "Retry-After-Ms": str(retry_ms)})

    def _ahead_of_share(self, task_type: str) -> bool:
        """Cocktail training: a type that already has two batches' worth of its share in flight waits."""
        settings = self.config.training
        if not settings.task_ratios or task_type not in settings.task_ratios:
            return False
        quota = max(self.trainer.quotas().get(task_type, 0), 1) * settings.group_size
        outstanding = self.registry.open_by_type[task_type] + self.trainer.pending_by_type().get(task_type, 0)
        return outstanding >= 2 * quota

    def _check_task_type(self, task_type: str) -> None:
        """Cocktail training: a type must have a ratio; one that asks to begin is present (not absent)."""
        settings = self.config.training
        if not settings.task_ratios:
            return
        if task_type not in settings.task_ratios:
            raise bad_request(f"task type {task_type!r} has no ratio; the server trains "
                              f"{sorted(settings.task_ratios)}", param="task_type")
        self.trainer.note_begin(task_type)  # a deferred type is present, not absent

    def _check_quota(self, task_type: str) -> None:
        """Cocktail training: defer (429) a type that already has two batches' worth of its share in flight."""
        self._check_task_type(task_type)
        if self._ahead_of_share(task_type):
            raise self._deferred(task_type, QUOTA_RETRY_MS)

    def capacity(self) -> int:
        """Training episodes that may begin now without going past the staleness bound (``admission.py``)."""
        t = self.config.training
        return capacity(version=self.engine.policy_version, batch_episodes=t.batch_groups * t.group_size,
                        max_staleness=t.max_staleness, accepted=self.trainer.accepted_count,
                        running=self.registry.open_training, max_concurrent=t.max_concurrent)

    def _begun_in_group(self, group_key: str) -> int:
        return self.registry.open_by_group[group_key] + self.trainer.pending_in_group(group_key)

    def reserved(self) -> int:
        """Places held for the members that begun groups still lack (``admission.reserved``), for
        ``group_timeout_s`` after the group's admission: a member that never comes (its client was killed) does
        not hold its place for longer."""
        t = self.config.training
        keys = set(self.registry.open_by_group) | set(self.trainer.pending_group_keys())
        return reserved((self._begun_in_group(k) for k in keys if self.trainer.admitted_within(k, t.group_timeout_s)),
                        t.group_size)

    def _check_capacity(self, group_key: str) -> None:
        t = self.config.training
        if not t.admission or admits(capacity_now=self.capacity() - self.reserved(), group_size=t.group_size,
                                     begun_in_group=self._begun_in_group(group_key)):
            return
        self.admission_refusals += 1
        raise self._at_capacity(CAPACITY_RETRY_MS)

    def heartbeat(self, key: str | None, episode_id: str) -> HeartbeatResponse:
        ep = self.keys.by_key(key, episode_id)
        if not ep.is_open:
            raise conflict(f"episode {episode_id} is {ep.status.value}", f"episode_{ep.status.value}")
        self.registry.touch(ep)
        return HeartbeatResponse(episode_id=episode_id, status=ep.status,
                                 lease_remaining_seconds=self.registry.lease_remaining(ep),
                                 policy_version=self.engine.policy_version)

    # ------------------------------------------------------------------ calls
    async def tito_prompt_ids(self, ep: Episode, agent: str, messages: list[dict[str, Any]],
                              tools: list[dict[str, Any]] | None, plain_ids: list[int]) -> list[int]:
        """Token-in, token-out (``tracking.tito``): the prompt with this agent's earlier generations spliced in
        as generated. Runs in a worker thread (it re-renders the conversation) on a snapshot of the calls."""
        if not self.config.tracking.tito or not may_splice(ep.calls, agent, messages):
            return plain_ids
        ids, outcome, drift = await asyncio.to_thread(request_prompt_ids, self.formatter, plain_ids, list(ep.calls),
                                                      agent, messages, tools)
        self.tito.count(outcome, drift)
        return ids

    def record_call(self, ep: Episode, call: CallRecord) -> None:
        ep.calls.append(call)
        self.throughput.calls += 1
        self.throughput.generated_tokens += len(call.completion_ids)

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
                await asyncio.to_thread(self.store.commit_episode, stored, samples, req.metadata, report.to_dict())
                self.tracking_totals.add(report.to_dict())  # observe: merge ratio and drift repairs
            except StoreError as exc:
                log.error("%s", exc)
                self.store_healthy = False  # the episode stays open: the client can retry
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
                self.acknowledged(stored)
            self.pump_admission()
        return ep.end_response

    def acknowledged(self, stored: StoredEpisode) -> None:
        """An episode is durable and final (ended, or a team episode committed): count it, train it."""
        self.throughput.ended += 1
        if stored.status is StoredStatus.PENDING:
            self.trainer.add(stored)

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
            self.pump_admission()
        return AbortEpisodeResponse(episode_id=episode_id, status=ep.status)
