"""The read side of a running server for the observe room (dashboard pages and metrics).

``ServerSource`` implements ``agentjet.observe.schema.DashboardSource`` on a server's ``RunParts``. Its run view
is the run's one snapshot (``run_state.snapshot``, which the status renders too). It reads the sample store
through ``store.StoreReader`` (a read-only connection of its own, so dashboard polls never wait on the store
lock that the request path and the trainer hold); the SQL lives in the store (``store/reader.py``).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

from agentjet.observe.schema import (
    ClientRow,
    EpisodeFilter,
    EpisodeRow,
    EpisodeStatusFilter,
    EvalRow,
    RunSnapshot,
    StepRow,
)
from agentjet.protocol import EpisodeStatus, reward_mean
from agentjet.server.episodes.registry import Episode
from agentjet.server.views.run_state import RunParts, snapshot
from agentjet.settings import ServerConfig
from agentjet.tracking import sample_trace

_STORED_STATUSES = {
    EpisodeStatusFilter.PENDING: ("pending",),
    EpisodeStatusFilter.TRAINED: ("trained",),
    EpisodeStatusFilter.EVAL: ("eval",),
    EpisodeStatusFilter.DROPPED: ("dropped_stale", "dropped_uniform"),
    EpisodeStatusFilter.FAILED: ("aborted",),  # team-aborted (the others are not stored)
    EpisodeStatusFilter.ABORTED: ("aborted",),
}
_LIVE_STATUSES = {
    EpisodeStatusFilter.OPEN: (EpisodeStatus.OPEN,),
    EpisodeStatusFilter.FAILED: (EpisodeStatus.EXPIRED, EpisodeStatus.ABORTED),
    EpisodeStatusFilter.EXPIRED: (EpisodeStatus.EXPIRED,),
    EpisodeStatusFilter.ABORTED: (EpisodeStatus.ABORTED,),
}


class ServerSource:
    def __init__(self, run: RunParts) -> None:
        self.run = run
        self.reader = run.reader

    # ------------------------------------------------------------------ DashboardSource
    def snapshot(self) -> RunSnapshot:
        """The run's one snapshot (``run_state.snapshot``), the same that ``GET /swarm/v1/status`` renders."""
        return snapshot(self.run)

    def steps(self, after: int, limit: int, adapter: str | None = None) -> list[StepRow]:
        """The train steps after ``after``: the one policy's, or on a server with several LoRA adapters the named
        adapter's (by default its first, the default adapter)."""
        names = [lane.name for lane in list(self.run.train_loop.lanes) if lane.name is not None]
        if names and adapter is None:
            adapter = names[0]
        return [StepRow(step=r.step, policy_version=r.policy_version, metrics=r.metrics, time=r.created_at)
                for r in self.reader.steps(after, limit, adapter)]

    def evals(self) -> list[EvalRow]:
        """Mean eval reward per (policy version, task type, difficulty level, agent): one curve per level."""
        acc: dict[tuple[int, str, int, str], list[float]] = defaultdict(list)
        for e in self.reader.eval_rewards():
            level = -1 if e.level is None else e.level  # sorts first; None again below
            acc[(e.policy_version, e.task_type, level, "*")].append(reward_mean(e.reward))
            if isinstance(e.reward, dict):
                for agent, value in e.reward.items():
                    acc[(e.policy_version, e.task_type, level, agent)].append(float(value))
        return [EvalRow(policy_version=v, task_type=t, level=None if k < 0 else k, agent=a,
                        reward_mean=sum(rs) / len(rs), episodes=len(rs))
                for (v, t, k, a), rs in sorted(acc.items())]

    def clients(self) -> list[ClientRow]:
        reg = self.run.registry
        stored: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for client, by_status in self.reader.counts_by_client().items():
            stored[client].update(by_status)
        ids = sorted(set(reg.clients) | set(stored), key=lambda c: -reg.clients.get(c, 0.0))
        return [ClientRow(client_id=cid, last_seen=reg.clients.get(cid, 0.0), open_episodes=reg.open_for_client(cid),
                          stored_episodes=sum(stored[cid].values()) - stored[cid]["aborted"],
                          trained_episodes=stored[cid]["trained"],
                          expired=reg.closed_by_client[cid]["expired"] if cid in reg.closed_by_client else 0,
                          aborted=(reg.closed_by_client[cid]["aborted"] if cid in reg.closed_by_client else 0)
                          + stored[cid]["aborted"])
                for cid in ids]

    def episodes(self, query: EpisodeFilter) -> list[EpisodeRow]:
        rows: list[EpisodeRow] = []
        if query.status is None or query.status in _LIVE_STATUSES:
            rows += self._live_episodes(query)
        if query.status is None or query.status in _STORED_STATUSES:
            rows += self._stored_episodes(query)
        rows.sort(key=lambda r: -(r.ended_at or time.time()))
        return rows[:query.limit]

    def _live_episodes(self, q: EpisodeFilter) -> list[EpisodeRow]:
        if q.min_reward is not None or q.max_reward is not None:
            return []  # no reward yet
        want = (_LIVE_STATUSES[q.status] if q.status is not None
                else _LIVE_STATUSES[EpisodeStatusFilter.OPEN] + _LIVE_STATUSES[EpisodeStatusFilter.FAILED])
        out = []
        for ep in reversed(self.run.registry.episodes()):
            if ep.status not in want or not _live_match(ep, q):
                continue
            out.append(EpisodeRow(episode_id=ep.episode_id, client_id=ep.client_id, task_id=ep.task_id,
                                  task_type=ep.task_type, status=ep.status.value, eval=ep.is_eval, reward=None,
                                  reward_mean=None, begin_policy_version=ep.begin_policy_version,
                                  min_policy_version=None, consumed_step=None, calls=len(ep.calls), samples=0,
                                  ended_at=None if ep.is_open else ep.created_at))
            if len(out) >= q.limit:
                break
        return out

    def _stored_episodes(self, q: EpisodeFilter) -> list[EpisodeRow]:
        statuses = _STORED_STATUSES[q.status] if q.status is not None else None
        equals = {col: value for col, value in (("task_type", q.task_type), ("client_id", q.client_id),
                                                ("begin_policy_version", q.version)) if value is not None}
        # reward filters apply to the mean reward (a dict reward is averaged): filtered here, so page through
        limit = q.limit if q.min_reward is None and q.max_reward is None else 100_000
        out = []
        for r in self.reader.episodes(statuses, equals, q.eval, limit):
            mean = reward_mean(r["reward"])
            if (q.min_reward is not None and mean < q.min_reward) or (q.max_reward is not None and mean > q.max_reward):
                continue
            out.append(EpisodeRow(episode_id=r["episode_id"], client_id=r["client_id"], task_id=r["task_id"],
                                  task_type=r["task_type"], status=r["status"],
                                  eval=r["status"] == "eval" or r["commit_status"] == "eval", reward=r["reward"],
                                  reward_mean=mean, begin_policy_version=r["begin_policy_version"],
                                  min_policy_version=r["min_policy_version"], consumed_step=r["consumed_step"],
                                  calls=r["n_calls"], samples=r["n_samples"], ended_at=r["ended_at"],
                                  team_id=r["team_id"]))
            if len(out) >= q.limit:
                break
        return out

    def trace(self, episode_id: str) -> dict[str, Any] | None:
        """The token-level trace of a stored episode, with the trainer's view (None: not stored). The one trace
        builder: ``GET /swarm/v1/episodes/{id}/trace`` answers this too."""
        run = self.run
        row = run.store.trace_row(episode_id)
        if row is None:
            return None
        samples = run.store.samples_for([episode_id])[episode_id]
        trained = run.trainlog.for_episode(episode_id)
        out_samples = []
        for i, smp in enumerate(samples):
            t = sample_trace(smp, run.engine.tokenizer)
            t["trainer"] = _trainer_view(trained.get(i), smp.loss_mask)
            out_samples.append(t)
        ep = row.episode
        team = None
        if ep.team_id:
            roles = row.metadata.get("team_roles")
            roles = roles if isinstance(roles, dict) else {}
            team = {"team_id": ep.team_id, "coordinator": ep.team_coordinator,
                    "roles": {str(k): str(v) for k, v in roles.items()}}
        return {"episode_id": ep.episode_id, "client_id": ep.client_id, "task_id": ep.task_id,
                "task_type": ep.task_type, "status": ep.status.value, "reward": ep.reward,
                "reward_mean": reward_mean(ep.reward), "begin_policy_version": ep.begin_policy_version,
                "min_policy_version": ep.min_policy_version, "consumed_step": row.consumed_step,
                "calls": ep.n_calls, "ended_at": ep.ended_at, "metadata": row.metadata, "report": row.report,
                "team": team, "samples": out_samples}

    def team_episodes(self, team_id: str) -> list[str]:
        return self.reader.team_episodes(team_id)

    def tokens(self) -> list[str]:
        cfg = self.run.config
        return [t for t in (ServerConfig.secret(cfg.observe.read_token), ServerConfig.secret(cfg.admin_token)) if t]


def _live_match(ep: Episode, q: EpisodeFilter) -> bool:
    return ((q.task_type is None or ep.task_type == q.task_type)
            and (q.client_id is None or ep.client_id == q.client_id)
            and (q.version is None or ep.begin_policy_version == q.version)
            and (q.eval is None or ep.is_eval == q.eval))


def _trainer_view(row: dict[str, Any] | None, loss_mask: list[int]) -> dict[str, Any] | None:
    """The trainer's record of a sample, with its logprobs laid out per token (None where nothing was trained)."""
    if row is None:
        return None
    per_token: list[float | None] = [None] * len(loss_mask)
    lps = row["trainer_logprobs"]
    if lps is not None:
        positions = [i for i, m in enumerate(loss_mask) if m]
        for pos, lp in zip(positions, lps, strict=False):
            per_token[pos] = None if math.isnan(lp) else lp  # NaN: masked as stale, not trained
    return {"step": row["step"], "policy_version": row["policy_version"], "advantage": row["advantage"],
            "logprobs": per_token if lps is not None else None}
