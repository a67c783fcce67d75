"""SwarmServer: the state behind the HTTP routes (engine, registry, store, trainer) and the episode logic."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentjet.engines.base import Engine
from agentjet.protocol import (
    SWARM_PREFIX,
    AbortEpisodeResponse,
    BeginEpisodeRequest,
    BeginEpisodeResponse,
    BufferCounts,
    ChangeRecord,
    EndEpisodeRequest,
    EndEpisodeResponse,
    EpisodeStatus,
    HeartbeatResponse,
    JoinRequest,
    JoinResponse,
    PrepareEpisodeRequest,
    ServerStatus,
    TeamDecision,
    TeamDecisionResponse,
    reward_mean,
)
from agentjet.server.chat import ChatFormatter
from agentjet.server.config import ServerConfig
from agentjet.server.errors import (
    APIError,
    bad_request,
    conflict,
    forbidden,
    not_found,
    unauthorized,
    unavailable,
)
from agentjet.server.locks import KeyedLocks
from agentjet.server.registry import Episode, EpisodeRegistry, hash_key
from agentjet.server.store import SampleStore, StoredEpisode, StoredStatus, StoreError
from agentjet.server.tito import TitoCounters, may_splice, request_prompt_ids
from agentjet.server.trainer import Trainer
from agentjet.tracking import CallRecord, EpisodeSample, TrackingReport, sample_trace, track_episode

log = logging.getLogger(__name__)


@dataclass
class Throughput:
    started: float = field(default_factory=time.monotonic)
    calls: int = 0
    generated_tokens: int = 0
    ended: int = 0

    def as_dict(self) -> dict[str, float]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {"uptime_s": elapsed, "calls": self.calls, "generated_tokens": self.generated_tokens,
                "episodes_ended": self.ended, "calls_per_s": self.calls / elapsed,
                "tokens_per_s": self.generated_tokens / elapsed}


class SwarmServer:
    def __init__(self, config: ServerConfig, engine: Engine, resume: bool = False) -> None:
        self.config = config
        self.engine = engine
        self.resume = resume
        self.formatter = ChatFormatter(engine.tokenizer)
        self.registry = EpisodeRegistry(config.lease_seconds)
        self.store = SampleStore(config.data_dir / "store.sqlite")
        self.trainer = Trainer(engine, self.store, config.training, config.data_dir / "checkpoints")
        self.throughput = Throughput()
        self.tito = TitoCounters()
        self._end_locks = KeyedLocks()  # one end / prepare / commit at a time per episode
        self._reaper: asyncio.Task[None] | None = None
        self.engine_state = "starting"
        self._prepared: dict[str, float] = {}  # prepared team episode id -> resolution deadline (monotonic)
        self.store_healthy = True  # False after a failed write, until a probe succeeds
        self.change_log: list[ChangeRecord] = []  # live config changes, with the version they took effect at
        self.on_stop: Callable[[], None] | None = None  # set by whoever runs the HTTP server

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if hasattr(self.engine, "set_learning_rate"):
            self.engine.set_learning_rate(self.config.training.learning_rate)
        if self.resume:
            await asyncio.to_thread(self.trainer.resume)
        for ep in self.store.prepared_episodes():  # team episodes prepared before a restart
            self._prepared[ep.episode_id] = time.monotonic() + self.config.lease_seconds
        n = self.trainer.load_pending()
        if n:
            log.info("%d acknowledged episodes waiting in the store", n)
        self.trainer.start()
        self._reaper = asyncio.get_running_loop().create_task(self._reap_loop())
        self.engine_state = "ready"

    async def stop(self, checkpoint: bool = True) -> None:
        self.engine_state = "stopping"
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await self.trainer.stop()
        if checkpoint and self.trainer.counters.train_steps:
            await asyncio.to_thread(self.trainer.save_checkpoint)
        await self.engine.close()
        self.store.close()
        self.engine_state = "stopped"

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.config.lease_seconds / 4))
            for ep in self.registry.expire_due():
                log.info("episode %s (client %s) expired: lease ran out", ep.episode_id, ep.client_id)
            if self._prepared:
                await self.resolve_expired_prepared()

    # ------------------------------------------------------------------ auth
    @staticmethod
    def _token_ok(given: str | None, expected: str | None) -> bool:
        if expected is None:
            return True
        return given is not None and hmac.compare_digest(given.encode(), expected.encode())

    def check_swarm_token(self, token: str | None) -> None:
        if not self._token_ok(token, self.config.swarm_token):
            raise unauthorized("a valid swarm token is required (Authorization: Bearer <swarm token>)")

    def check_admin_token(self, token: str | None) -> None:
        if self.config.admin_token is None:
            return
        if not self._token_ok(token, self.config.admin_token):
            raise unauthorized("this action needs the admin token (Authorization: Bearer <admin token>)")

    def episode_for_key(self, key: str | None, episode_id: str | None = None) -> Episode:
        if not key:
            raise unauthorized("missing episode key (Authorization: Bearer <episode api_key>)")
        ep = self.registry.by_key(key)
        if ep is None:
            raise unauthorized("unknown or expired episode key")
        if episode_id is not None and ep.episode_id != episode_id:
            raise forbidden("this episode key belongs to another episode")
        return ep

    def open_episode_for_key(self, key: str | None) -> Episode:
        ep = self.episode_for_key(key)
        if not ep.is_open:
            raise unauthorized(f"episode {ep.episode_id} is {ep.status.value}; its key no longer accepts calls")
        return ep

    # ------------------------------------------------------------------ swarm API
    def join(self, req: JoinRequest) -> JoinResponse:
        released = self.registry.release_client(req.client_id)
        if released:
            log.info("client %s rejoined: released %d open episodes of its earlier process", req.client_id, released)
        return JoinResponse(client_id=req.client_id, model=self.config.name, policy_version=self.engine.policy_version,
                            lease_seconds=self.config.lease_seconds, released_episodes=released)

    def begin(self, req: BeginEpisodeRequest) -> BeginEpisodeResponse:
        if self.engine_state != "ready":
            raise unavailable(f"the server is {self.engine_state}", "not_ready", retry_after_s=1)
        if not self.store_healthy:
            try:
                self.store.probe()
            except StoreError as exc:
                raise unavailable(f"{exc}; the server accepts no new episodes until its store can be written "
                                  "(disk full or read-only?)", "store_unavailable", retry_after_s=10) from exc
            self.store_healthy = True
        cap = self.config.max_open_episodes_per_client
        if self.registry.open_for_client(req.client_id) >= cap:
            raise APIError(429, f"client {req.client_id!r} already has {cap} open episodes (the limit); end or "
                           "abort some first", "rate_limit_error", code="too_many_open_episodes",
                           headers={"Retry-After": "1"})
        if not req.eval:
            self._check_quota(req.task_type)
        ep, key = self.registry.begin(req, self.engine.policy_version)
        self.trainer.note_begin(req.task_type)
        return BeginEpisodeResponse(episode_id=ep.episode_id, api_key=key, base_url=self.config.base_url(),
                                    lease_seconds=self.config.lease_seconds, policy_version=self.engine.policy_version)

    def _check_quota(self, task_type: str) -> None:
        """Cocktail training: defer a type that already has two batches' worth of its share in flight."""
        settings = self.config.training
        if not settings.task_ratios:
            return
        if task_type not in settings.task_ratios:
            raise bad_request(f"task type {task_type!r} has no ratio; the server trains "
                              f"{sorted(settings.task_ratios)}", param="task_type")
        self.trainer.note_begin(task_type)  # a deferred type is present, not absent
        quota = max(self.trainer.quotas().get(task_type, 0), 1) * settings.group_size
        outstanding = self.registry.open_by_type[task_type] + self.trainer.pending_by_type().get(task_type, 0)
        if outstanding >= 2 * quota:
            retry_ms = 500
            raise APIError(429, f"task type {task_type!r} is ahead of its share ({settings.task_ratios[task_type]} of "
                           f"each batch): retry after {retry_ms} ms", "rate_limit_error", param="task_type",
                           code="deferred", headers={"Retry-After": "1", "Retry-After-Ms": str(retry_ms)})

    def heartbeat(self, key: str | None, episode_id: str) -> HeartbeatResponse:
        ep = self.episode_for_key(key, episode_id)
        if not ep.is_open:
            raise conflict(f"episode {episode_id} is {ep.status.value}", f"episode_{ep.status.value}")
        self.registry.touch(ep)
        return HeartbeatResponse(episode_id=episode_id, status=ep.status,
                                 lease_remaining_seconds=self.registry.lease_remaining(ep),
                                 policy_version=self.engine.policy_version)

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

    def trace(self, key: str | None, episode_id: str) -> dict[str, Any]:
        """Token-level trace of a stored episode: for the admin, or for the episode's own key."""
        admin = self.config.admin_token is None or self._token_ok(key, self.config.admin_token)
        if not admin:
            self._authorize_stored(key, episode_id)
        stored = self.store.get_episode(episode_id)
        if stored is None:
            raise not_found(f"episode {episode_id} has no stored samples (unknown, still open, aborted or expired)")
        samples = self.store.samples_for([episode_id])[episode_id]
        tok = self.engine.tokenizer
        return {"episode_id": episode_id, "task_id": stored.task_id, "task_type": stored.task_type,
                "status": stored.status.value, "reward": stored.reward, "calls": stored.n_calls,
                "report": self.store.tracking_report(episode_id),
                "samples": [sample_trace(smp, tok) for smp in samples]}

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
        return await self._finish(key, episode_id, req, None)

    async def prepare(self, key: str | None, episode_id: str, req: PrepareEpisodeRequest) -> EndEpisodeResponse:
        """Team phase one: store durably as PREPARED (not trainable until commit). Idempotent."""
        return await self._finish(key, episode_id, req, req)

    async def _finish(self, key: str | None, episode_id: str, req: EndEpisodeRequest,
                      team: PrepareEpisodeRequest | None) -> EndEpisodeResponse:
        ep = self._episode_or_stored(key, episode_id)
        if isinstance(ep, EndEpisodeResponse):
            return ep
        async with self._end_locks.hold(episode_id):
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
                final = StoredStatus.EVAL if ep.is_eval else StoredStatus.PENDING
                stored = StoredEpisode(
                    episode_id=ep.episode_id, key_hash=ep.key_hash, client_id=ep.client_id, task_id=ep.task_id,
                    task_type=ep.task_type, group_key=ep.group_key, reward=req.reward,
                    status=StoredStatus.PREPARED if team else final, n_calls=len(calls),
                    n_samples=len(samples), begin_policy_version=ep.begin_policy_version,
                    min_policy_version=min((c.policy_version for c in calls), default=ep.begin_policy_version),
                    ended_at=time.time(), commit_status=final,
                    team_id=team.team_id if team else None, team_coordinator=team.coordinator_url if team else None,
                    team_secret=team.team_secret if team else None)
                await asyncio.to_thread(self.store.commit_episode, stored, samples, req.metadata, report.to_dict())
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
                self._prepared[episode_id] = time.monotonic() + self.config.lease_seconds
            else:
                self.throughput.ended += 1
                if not ep.is_eval:
                    self.trainer.add(stored)
        return ep.end_response

    async def commit(self, key: str | None, episode_id: str) -> EndEpisodeResponse:
        """Team phase two: a prepared episode becomes trainable. Idempotent."""
        self._authorize_stored(key, episode_id)
        return await self._resolve(episode_id, commit=True)

    async def _resolve(self, episode_id: str, commit: bool) -> EndEpisodeResponse:
        async with self._end_locks.hold(episode_id):
            stored, changed = await asyncio.to_thread(self.store.resolve_prepared, episode_id, commit)
        self._prepared.pop(episode_id, None)
        committed = stored.status in (StoredStatus.PENDING, StoredStatus.EVAL, StoredStatus.TRAINED,
                                      StoredStatus.DROPPED_STALE, StoredStatus.DROPPED_UNIFORM)
        if stored.status is StoredStatus.PREPARED:  # not resolved: should not happen
            raise conflict(f"episode {episode_id} is still prepared", "episode_prepared")
        ep = self.registry.get(episode_id)
        if ep is not None:
            ep.status = EpisodeStatus.ENDED if committed else EpisodeStatus.ABORTED
        if changed:
            log.info("team episode %s (team %s) %s", episode_id, stored.team_id, "committed" if committed else "aborted")
            if committed:
                self.throughput.ended += 1
                if stored.status is StoredStatus.PENDING:
                    self.trainer.add(stored)
        if commit and not committed:
            raise conflict(f"episode {episode_id} was aborted: its team did not commit", "team_aborted")
        if not commit and committed:
            raise conflict(f"episode {episode_id} was already committed", "episode_ended")
        return EndEpisodeResponse(episode_id=episode_id, status=EpisodeStatus.ENDED if committed else
                                  EpisodeStatus.ABORTED, acknowledged=committed, duplicate=not changed,
                                  calls=stored.n_calls, samples=stored.n_samples)

    def _authorize_stored(self, key: str | None, episode_id: str) -> None:
        """The episode key authorises its own episode, also after a restart (the store keeps its hash)."""
        ep = self.registry.get(episode_id)
        if ep is not None:
            self.episode_for_key(key, episode_id)
            return
        stored = self.store.get_episode(episode_id)
        if stored is None or not key or not hmac.compare_digest(stored.key_hash, hash_key(key)):
            raise unauthorized("unknown or expired episode key")

    def team_decision(self, team_id: str, secret: str | None) -> TeamDecisionResponse:
        decision = self.store.team_decision(team_id, secret or "")
        return TeamDecisionResponse(team_id=team_id, decision=TeamDecision(decision) if decision
                                    else TeamDecision.UNDECIDED)

    async def resolve_expired_prepared(self) -> None:
        """A prepared team episode whose commit never came (the client died between the phases): the
        coordinator aborts and records it; a participant follows the coordinator's decision."""
        now = time.monotonic()
        for eid, deadline in list(self._prepared.items()):
            if deadline > now:
                continue
            stored = self.store.get_episode(eid)
            if stored is None or stored.status is not StoredStatus.PREPARED:
                self._prepared.pop(eid, None)
                continue
            if stored.team_coordinator is None:
                await self._resolve_quietly(eid, commit=False)
                continue
            decision = await self._ask_coordinator(stored)
            if decision is TeamDecision.UNDECIDED:
                self._prepared[eid] = now + min(5.0, self.config.lease_seconds)  # ask again later
            else:
                await self._resolve_quietly(eid, commit=decision is TeamDecision.COMMITTED)

    async def _resolve_quietly(self, episode_id: str, commit: bool) -> None:
        with contextlib.suppress(APIError):
            await self._resolve(episode_id, commit)

    async def _ask_coordinator(self, stored: StoredEpisode) -> TeamDecision:
        import httpx

        url = f"{(stored.team_coordinator or '').rstrip('/')}{SWARM_PREFIX}/teams/{stored.team_id}"
        try:
            async with httpx.AsyncClient(timeout=5) as http:
                r = await http.get(url, headers={"Authorization": f"Bearer {stored.team_secret}"})
            return TeamDecision(r.json()["decision"]) if r.status_code == 200 else TeamDecision.UNDECIDED
        except (httpx.HTTPError, ValueError, KeyError):
            log.warning("team %s: coordinator %s unreachable; episode %s stays prepared", stored.team_id,
                        stored.team_coordinator, stored.episode_id)
            return TeamDecision.UNDECIDED

    def _episode_or_stored(self, key: str | None, episode_id: str) -> Episode | EndEpisodeResponse:
        """The live episode, or (after a server restart) the acknowledgement of a stored one."""
        try:
            return self.episode_for_key(key, episode_id)
        except APIError:
            stored = self.store.get_episode(episode_id)
            if stored is not None and key and hmac.compare_digest(stored.key_hash, hash_key(key)):
                return EndEpisodeResponse(episode_id=episode_id, status=EpisodeStatus.ENDED, acknowledged=True,
                                          duplicate=True, calls=stored.n_calls, samples=stored.n_samples)
            raise

    async def abort(self, key: str | None, episode_id: str, reason: str) -> AbortEpisodeResponse:
        ep = self.episode_for_key(key, episode_id)
        if ep.status is EpisodeStatus.PREPARED:
            await self._resolve(episode_id, commit=False)
            return AbortEpisodeResponse(episode_id=episode_id, status=EpisodeStatus.ABORTED)
        if ep.status is EpisodeStatus.ENDED:
            raise conflict(f"episode {episode_id} already ended and was acknowledged", "episode_ended")
        if ep.is_open:
            log.info("episode %s aborted by client %s: %s", episode_id, ep.client_id, reason or "(no reason)")
            ep.calls.clear()
            self.registry.close(ep, EpisodeStatus.ABORTED)
        return AbortEpisodeResponse(episode_id=episode_id, status=ep.status)

    # ------------------------------------------------------------------ status
    def eval_reward_by_version(self) -> dict[str, float]:
        sums: dict[int, list[float]] = defaultdict(list)
        for version, reward in self.store.eval_rewards():
            sums[version].append(reward_mean(reward))
        return {str(v): sum(rs) / len(rs) for v, rs in sorted(sums.items())}

    def status(self) -> ServerStatus:
        counts = self.store.count_by_status()
        c = self.trainer.counters
        buffer = BufferCounts(
            open_episodes=self.registry.open_count, pending_episodes=counts["pending"],
            trained_episodes=counts["trained"], dropped_stale_episodes=counts["dropped_stale"],
            dropped_uniform_episodes=counts["dropped_uniform"], expired_episodes=self.registry.counts["expired"],
            aborted_episodes=self.registry.counts["aborted"], eval_episodes=counts["eval"])
        return ServerStatus(
            model=self.config.name, engine=type(self.engine).__name__,
            engine_state="paused" if self.trainer.paused else self.engine_state,
            policy_version=self.engine.policy_version, train_steps=c.train_steps, buffer=buffer,
            clients=sorted(self.registry.clients), throughput={**self.throughput.as_dict(), **self.tito.as_dict()},
            eval_reward=self.eval_reward_by_version(), last_train_metrics=c.last_metrics,
            task_types={t: {"episodes": v["episodes"], "reward_mean": v["reward_sum"] / max(v["episodes"], 1)}
                        for t, v in c.by_type.items()},
            config=self.public_config(), training_halted=c.halted_reason)

    def public_config(self) -> dict[str, Any]:
        cfg = self.config.model_dump(mode="json", exclude={"swarm_token", "admin_token"})
        return cfg
