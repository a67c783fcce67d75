"""One train step on a batch of groups: per-agent advantages within each group, the per-token staleness mask
(``server/training/staleness.py``: tokens more than ``max_staleness`` versions old leave the loss; younger off-policy tokens
are corrected by the learner's clipped importance ratio against their behaviour logprobs), the engine's
``train_step``, and the commit: the episodes marked trained in the store with the step's record, the counters, the
observer, and a checkpoint when one is due. Settings are read afresh for each batch."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from agentjet.algorithms import AdvantageEstimator, compute_advantages
from agentjet.engines.base import Engine, StepOutput, TrainSample
from agentjet.observe.events import StepObserver, StepRecord, TrainedSample, staleness_metrics
from agentjet.protocol import reward_mean
from agentjet.runtime.clock import Clock
from agentjet.server.counters import TrainingCounters
from agentjet.server.store import StoredStatus, TrainingStore
from agentjet.server.training.checkpoints import Checkpoints
from agentjet.server.training.pool import Group
from agentjet.server.training.staleness import fresh_samples, logprobs_on_stored_mask
from agentjet.settings import ServerConfig
from agentjet.tracking import EpisodeSample

log = logging.getLogger(__name__)


def episode_reward(reward: float | dict[str, float], agent: str) -> float:
    if isinstance(reward, dict):
        return float(reward[agent])
    return float(reward)


def group_advantages(
    group: Group, samples: dict[str, list[EpisodeSample]], estimator: AdvantageEstimator, scale_by_std: bool = True
) -> dict[tuple[str, str], float]:
    """(episode id, agent) -> advantage, computed among the group's episodes that have that agent."""
    by_agent: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for ep in group.episodes:
        for agent in sorted({s.agent for s in samples.get(ep.episode_id, [])}):
            by_agent[agent].append((ep.episode_id, episode_reward(ep.reward, agent)))
    out: dict[tuple[str, str], float] = {}
    for agent, pairs in by_agent.items():
        advs = compute_advantages([r for _, r in pairs], estimator, scale_by_std=scale_by_std)
        for (eid, _), a in zip(pairs, advs, strict=True):
            out[(eid, agent)] = a
    return out


def to_train_samples(samples: list[EpisodeSample], advantage: float) -> list[TrainSample]:
    """An episode's samples for one agent, with the loss weights context tracking gave them (by default each
    episode counts once however many samples it yields: see agentjet.tracking.weights)."""
    return [TrainSample(
        input_ids=s.input_ids, loss_mask=s.loss_mask, behaviour_logprobs=s.behaviour_logprobs,
        advantages=[advantage if m else 0.0 for m in s.loss_mask], temperature=s.temperature, weight=s.weight,
    ) for s in samples]


@dataclass
class Batch:
    """A batch of groups laid out for the learner, with what the commit and the observer need."""

    samples: list[TrainSample] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    agent_rewards: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    refs: list[tuple[str, int, str, float]] = field(default_factory=list)  # (episode, sample index, agent, adv)
    relaid: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)  # index -> (stored, used) masks
    stale_tokens: int = 0  # masked as stale, of the trained tokens before the bound
    bound_tokens: int = 0

    @property
    def tokens(self) -> int:
        return sum(s.num_trained_tokens for s in self.samples)


class BatchStep:
    def __init__(self, engine: Engine, store: TrainingStore, counters: TrainingCounters,
                 config: Callable[[], ServerConfig], checkpoints: Checkpoints, clock: Clock,
                 adapter: str | None = None) -> None:
        """``adapter``: the LoRA adapter this step trains (a server with several), named in its records."""
        self.adapter = adapter
        self.engine = engine
        self.store = store
        self.counters = counters  # the read model's training counters: this step is their one writer of steps
        self._config = config
        self.checkpoints = checkpoints
        self.clock = clock
        self.observer: StepObserver | None = None
        self.waited_s = 0.0  # set by the loop: from the end of the previous step to this batch

    def lay_out(self, groups: list[Group], samples: dict[str, list[EpisodeSample]], version: int) -> Batch:
        config = self._config()
        batch = Batch()
        for g in groups:
            advs = group_advantages(g, samples, config.loss.estimator, config.loss.scale_by_std)
            for ep in g.episodes:
                by_agent: dict[str, list[tuple[int, EpisodeSample]]] = defaultdict(list)
                for i, s in enumerate(samples[ep.episode_id]):
                    by_agent[s.agent].append((i, s))
                for agent, agent_samples in by_agent.items():
                    adv = advs[(ep.episode_id, agent)]
                    fresh = fresh_samples(agent_samples, version, config.training.max_staleness)
                    batch.stale_tokens += fresh.masked
                    batch.bound_tokens += fresh.tokens
                    for i, kept in fresh.kept:
                        if kept is not samples[ep.episode_id][i]:
                            batch.relaid[len(batch.samples)] = (samples[ep.episode_id][i].loss_mask, kept.loss_mask)
                        batch.samples.extend(to_train_samples([kept], adv))
                    batch.refs.extend((ep.episode_id, i, agent, adv) for i, _ in fresh.kept)
                    batch.rewards.append(episode_reward(ep.reward, agent))
                    batch.agent_rewards[agent].append(batch.rewards[-1])
        return batch

    async def run(self, groups: list[Group]) -> dict[str, float]:
        """Train on ``groups`` and commit the step; returns its metrics ({} when the batch had nothing to train)."""
        t0 = self.clock.monotonic()
        ids = [ep.episode_id for g in groups for ep in g.episodes]
        samples = await asyncio.to_thread(self.store.samples_for, ids)
        version_before = self.engine.policy_version
        batch = self.lay_out(groups, samples, version_before)
        statuses = dict.fromkeys(ids, StoredStatus.TRAINED)
        if not batch.tokens:  # nothing to learn from (no calls made)
            self.store.mark_consumed(statuses, step=None)
            return {}
        t1 = self.clock.monotonic()
        out = await self.engine.train_step(batch.samples)
        trainer_logprobs = out.trainer_logprobs if isinstance(out, StepOutput) else []
        t2 = self.clock.monotonic()
        staleness = [version_before - ep.min_policy_version for g in groups for ep in g.episodes]
        metrics = self._metrics(dict(out), groups, batch, staleness, (t0, t1, t2), len(ids))
        step = self.counters.train_steps + 1
        version = self.engine.policy_version
        self.store.mark_consumed(statuses, step=step, step_record=(version, metrics))
        self.counters.stepped(step, episodes=len(ids), samples=len(batch.samples), tokens=batch.tokens,
                              metrics=metrics, version=version, train_s=metrics["time/training_s"],
                              sync_s=metrics["time/sync_s"])
        log.info("%sstep %d: policy v%d, %d episodes, reward %.3f, loss %.4f, %.1fs",
                 f"adapter {self.adapter}: " if self.adapter else "", step, version, len(ids),
                 metrics["reward_mean"], metrics.get("loss", 0.0), metrics.get("step_seconds", 0.0))
        if self.observer is not None:
            record = StepRecord(step=step, policy_version=version, time=self.clock.time(), metrics=metrics,
                                staleness=staleness, adapter=self.adapter, samples=[
                                    TrainedSample(eid, i, agent, adv, _stored_layout(
                                        trainer_logprobs[k] if k < len(trainer_logprobs) else None,
                                        batch.relaid.get(k)))
                                    for k, (eid, i, agent, adv) in enumerate(batch.refs)])
            await asyncio.to_thread(self.observer.on_step, record)
        every = self._config().training.checkpoint_every
        if every and step % every == 0:
            try:
                await asyncio.to_thread(self.checkpoints.save)
            except Exception:  # the step is committed: its episodes must not go back into the pool
                log.exception("checkpoint after step %d failed; training goes on, the next is tried on schedule",
                              step)
        return metrics

    def _metrics(self, metrics: dict[str, float], groups: list[Group], batch: Batch, staleness: list[int],
                 times: tuple[float, float, float], episodes: int) -> dict[str, float]:
        rewards = batch.rewards
        out = {**metrics, "reward_mean": sum(rewards) / max(len(rewards), 1), "groups": float(len(groups)),
               "episodes": float(episodes), **self._type_metrics(groups),
               **{f"reward_agent/{a}": sum(r) / len(r) for a, r in sorted(batch.agent_rewards.items())},
               **self._timing(*times, metrics), **staleness_metrics(staleness),
               "staleness/masked_tokens": float(batch.stale_tokens),
               "staleness/masked_token_share": batch.stale_tokens / batch.bound_tokens if batch.bound_tokens else 0.0}
        if self.observer is not None:
            out.update(self.observer.step_context(out))
        return out

    def _timing(self, t0: float, t1: float, t2: float, metrics: dict[str, float]) -> dict[str, float]:
        """The step's wall time split: waiting for a batch, preparing it, training, weight sync (engine-reported)."""
        sync = float(metrics.get("sync_seconds", 0.0))
        return {"time/waiting_s": self.waited_s, "time/prepare_s": t1 - t0,
                "time/training_s": max(t2 - t1 - sync, 0.0), "time/sync_s": sync}

    def _type_metrics(self, groups: list[Group]) -> dict[str, float]:
        """Per task type: share of the batch's episodes and mean reward; accumulated for the status."""
        eps = [ep for g in groups for ep in g.episodes]
        out: dict[str, float] = {}
        for t in sorted({ep.task_type for ep in eps}):
            mine = [ep for ep in eps if ep.task_type == t]
            rewards = [reward_mean(ep.reward) for ep in mine]
            out[f"share/{t}"] = len(mine) / len(eps)
            out[f"reward/{t}"] = sum(rewards) / len(rewards)
            self.counters.trained_type(t, len(mine), sum(rewards))
        return out


def _stored_layout(lps: list[float] | None, masks: tuple[list[int], list[int]] | None) -> list[float] | None:
    """A sample's trainer logprobs, one per trained token of its stored loss mask (NaN where masked stale)."""
    return lps if masks is None else logprobs_on_stored_mask(lps, *masks)
