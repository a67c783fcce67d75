"""The batcher and training loop.

Acknowledged episodes wait in the store, grouped by group key (the task id unless the client set a
group id). A group is ready when it holds ``group_size`` episodes, or ``min_group_size`` after
``group_timeout_s``. A train step takes ``batch_groups`` ready groups in admission order (within the task
quotas: see ``candidate_groups``), computes per-agent advantages
within each group, and calls ``engine.train_step``. The staleness bound acts per token
(``server/staleness.py``): tokens generated more than ``max_staleness`` policy versions ago are masked out of
the loss, episodes whose tokens are all that old are dropped and counted; younger off-policy tokens are
corrected by the clipped importance ratio against their recorded behaviour logprobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agentjet.algorithms import AdvantageEstimator, compute_advantages
from agentjet.engines.base import Engine, StepOutput, TrainSample
from agentjet.engines.errors import TrainingHaltedError
from agentjet.observe.events import StepObserver, StepRecord, TrainedSample, staleness_metrics
from agentjet.protocol import reward_mean
from agentjet.server.clock import Clock, SystemClock
from agentjet.server.quotas import apportion
from agentjet.server.staleness import all_stale, fresh_samples, logprobs_on_stored_mask
from agentjet.server.store import SampleStore, StoredEpisode, StoredStatus
from agentjet.settings import AbsentPolicy, ServerConfig, TrainingSettings
from agentjet.tracking import EpisodeSample

log = logging.getLogger(__name__)

CHECKPOINT_STATE = "trainer_state.json"
CHECKPOINT_RUN = "agentjet_run.json"  # the model as the user named it and the public settings (ajet export's card)
MAX_ADMISSION_ORDER = 100_000  # group keys remembered in the admission order before the oldest unused are pruned


@dataclass
class Group:
    key: str
    episodes: list[StoredEpisode]

    @property
    def task_type(self) -> str:
        return self.episodes[0].task_type


@dataclass
class TrainerCounters:
    train_steps: int = 0
    trained_episodes: int = 0
    trained_samples: int = 0
    dropped_stale: int = 0
    dropped_uniform: int = 0
    trained_tokens: int = 0
    last_metrics: dict[str, float] = field(default_factory=dict)
    halted_reason: str | None = None  # set when the engine said training must stop (training is paused)
    by_type: dict[str, dict[str, float]] = field(default_factory=dict)  # task type -> episodes, reward_sum


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


def is_uniform(group: Group) -> bool:
    rewards = [json.dumps(ep.reward, sort_keys=True) for ep in group.episodes]
    return len(set(rewards)) <= 1


def to_train_samples(samples: list[EpisodeSample], advantage: float) -> list[TrainSample]:
    """An episode's samples for one agent, with the loss weights context tracking gave them (by default each
    episode counts once however many samples it yields: see agentjet.tracking.weights)."""
    return [TrainSample(
        input_ids=s.input_ids, loss_mask=s.loss_mask, behaviour_logprobs=s.behaviour_logprobs,
        advantages=[advantage if m else 0.0 for m in s.loss_mask], temperature=s.temperature, weight=s.weight,
    ) for s in samples]


class Trainer:
    """Reads ``config.training`` and ``config.loss`` afresh for every batch, so a live change (the control
    plane swaps those sections between steps) takes effect from the next batch."""

    def __init__(self, engine: Engine, store: SampleStore, config: ServerConfig, checkpoint_dir: Path,
                 clock: Clock | None = None) -> None:
        self.engine = engine
        self.store = store
        self.config = config
        self.checkpoint_dir = checkpoint_dir
        self.clock = clock or SystemClock()
        self.counters = TrainerCounters()
        self.paused = False
        self._pending: dict[str, list[StoredEpisode]] = defaultdict(list)
        self._first_seen: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._passes = 0  # passes of the train loop finished (each trains every ready batch, then idles)
        self._in_pass = False
        self._pass_done = asyncio.Condition()
        self.last_begin: dict[str, float] = {}  # task type -> monotonic time of its latest begin
        self.step_lock = asyncio.Lock()  # held by a train step; control actions take it to run between steps
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.in_step = 0  # episodes taken by the train step that is running (no longer pending, not yet trained)
        # observe hooks: the step's waiting time (from the end of the previous step to its batch), and an observer
        self.observer: StepObserver | None = None
        self._idle_since = self.clock.monotonic()
        self._waited_s = 0.0
        # admission order: group key -> its admission sequence number (batches take groups in this order)
        self._admitted: dict[str, int] = {}
        self._admitted_at: dict[str, float] = {}  # group key -> when its latest group was admitted (monotonic)
        self._admissions = 0
        self.on_capacity: Callable[[], None] | None = None  # called after each batching pass (admission wakes)

    @property
    def settings(self) -> TrainingSettings:
        return self.config.training

    # ------------------------------------------------------------ intake
    def add(self, ep: StoredEpisode) -> None:
        self._pending[ep.group_key].append(ep)
        self._first_seen.setdefault(ep.group_key, self.clock.monotonic())
        self._wake.set()

    def load_pending(self) -> int:
        eps = self.store.pending_episodes()
        for ep in eps:
            self.add(ep)
        return len(eps)

    def note_begin(self, task_type: str) -> None:
        self.last_begin[task_type] = self.clock.monotonic()

    def note_admitted(self, group_key: str) -> None:
        """A new group was admitted: it takes its place in the admission order (``candidate_groups``)."""
        self._admissions += 1
        self._admitted.setdefault(group_key, self._admissions)
        self._admitted_at[group_key] = self.clock.monotonic()
        if len(self._admitted) > MAX_ADMISSION_ORDER:  # groups that never reached the pool (all aborted)
            for key in sorted(self._admitted, key=self._admitted.__getitem__)[: len(self._admitted) // 2]:
                if key not in self._pending:
                    del self._admitted[key]
                    self._admitted_at.pop(key, None)

    def admitted_within(self, group_key: str, seconds: float) -> bool:
        """Whether the group's latest admission is at most ``seconds`` old (its missing members keep their
        places that long: ``group_timeout_s``, after which a partial group trains or waits without them)."""
        at = self._admitted_at.get(group_key)
        return at is not None and self.clock.monotonic() - at <= seconds

    def admission_rank(self, group_key: str) -> int:
        """Where a group stands in the admission order (groups admitted before a restart, or by a server with
        admission off, come first: 0)."""
        return self._admitted.get(group_key, 0)

    def pending_by_type(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for eps in self._pending.values():
            for ep in eps:
                counts[ep.task_type] += 1
        return counts

    def quotas(self) -> dict[str, int]:
        """Groups per batch for each task type (empty: no quotas)."""
        return apportion(self.settings.batch_groups, self.settings.task_ratios)

    def _absent(self, task_type: str) -> bool:
        seen = self.last_begin.get(task_type)
        return seen is None or self.clock.monotonic() - seen > self.settings.absent_after_s

    def select_batch(self, groups: list[Group]) -> list[Group] | None:
        """``batch_groups`` groups, composed to the task-type quotas when ratios are set."""
        n = self.settings.batch_groups
        quotas = self.quotas()
        if not quotas:
            return groups[:n] if len(groups) >= n else None
        by_type: dict[str, list[Group]] = defaultdict(list)
        for g in groups:
            by_type[g.task_type].append(g)
        batch: list[Group] = []
        short = 0
        for t, q in quotas.items():
            take = by_type[t][:q]
            batch += take
            if len(take) < q:
                if self.settings.absent_policy is AbsentPolicy.STRICT or not self._absent(t):
                    return None  # wait for this type's share
                short += q - len(take)
        if short:
            spare = [g for g in groups if g not in batch and g.task_type in quotas]
            if len(spare) < short:
                return None
            batch += spare[:short]
        return batch

    def wake(self) -> None:
        self._wake.set()

    async def pause(self, wait_for_step: bool = False) -> None:
        """Start no new train step. ``wait_for_step``: also wait for a step in progress to finish (it holds
        ``step_lock``; a step that has not taken the lock yet sees ``paused`` first and does not start)."""
        self.paused = True
        if wait_for_step:
            async with self.step_lock:
                pass

    def resume(self) -> None:
        self.paused = False
        self._wake.set()

    @property
    def pending_count(self) -> int:
        return sum(len(v) for v in self._pending.values())

    def pending_group_keys(self) -> list[str]:
        return list(self._pending)

    def pending_in_group(self, group_key: str) -> int:
        eps = self._pending.get(group_key)
        return len(eps) if eps else 0

    @property
    def accepted_count(self) -> int:
        """Acknowledged training episodes kept so far: trained, in the step running now, or pending (admission)."""
        return self.counters.trained_episodes + self.in_step + self.pending_count

    # ------------------------------------------------------------ batching
    def _drop_stale(self) -> None:
        version = self.engine.policy_version
        stale: dict[str, StoredStatus] = {}
        for key in list(self._pending):
            keep = []
            for ep in self._pending[key]:
                if all_stale(ep, version, self.settings.max_staleness):
                    stale[ep.episode_id] = StoredStatus.DROPPED_STALE
                else:
                    keep.append(ep)
            self._set_group(key, keep)
        if stale:
            self.store.mark_consumed(stale, step=self.counters.train_steps)
            self.counters.dropped_stale += len(stale)
            log.info("dropped %d stale episodes (all their tokens older than %d versions)", len(stale),
                     self.settings.max_staleness)

    def _set_group(self, key: str, eps: list[StoredEpisode]) -> None:
        if eps:
            self._pending[key] = eps
        else:
            self._pending.pop(key, None)
            self._first_seen.pop(key, None)
            self._admitted.pop(key, None)
            self._admitted_at.pop(key, None)

    def candidate_groups(self) -> list[Group]:
        """Groups that could be trained now, in admission order (nothing is taken out of the pool). With task
        quotas, ``select_batch`` takes each type's share from this order: when the two conflict, the quota wins
        (an earlier group waits for the next batch if its type's share of this one is full)."""
        s = self.settings
        now = self.clock.monotonic()
        groups: list[Group] = []
        for key, eps in self._pending.items():
            full = len(eps) // s.group_size
            groups.extend(Group(key, eps[i * s.group_size:(i + 1) * s.group_size]) for i in range(full))
            rest = eps[full * s.group_size:]
            timed_out = now - self._first_seen.get(key, now) > s.group_timeout_s
            if rest and timed_out and len(rest) >= s.min_group_size:
                groups.append(Group(key, rest))
        return sorted(groups, key=lambda g: self.admission_rank(g.key))

    def _take(self, groups: list[Group]) -> None:
        taken = {ep.episode_id for g in groups for ep in g.episodes}
        for key in {g.key for g in groups}:
            left = [ep for ep in self._pending.get(key, []) if ep.episode_id not in taken]
            self._set_group(key, left)
            if left:
                self._first_seen[key] = self.clock.monotonic()

    def _drop_uniform(self, groups: list[Group]) -> list[Group]:
        """Consume groups whose rewards are all equal (no learning signal); return the others."""
        if not self.settings.drop_uniform_groups:
            return groups
        uniform = [g for g in groups if is_uniform(g)]
        if uniform:
            self._take(uniform)
            self.store.mark_consumed({ep.episode_id: StoredStatus.DROPPED_UNIFORM for g in uniform
                                      for ep in g.episodes}, step=self.counters.train_steps)
            self.counters.dropped_uniform += sum(len(g.episodes) for g in uniform)
        return [g for g in groups if not is_uniform(g)]

    # ------------------------------------------------------------ training
    async def train_on(self, groups: list[Group]) -> dict[str, float]:
        t0 = self.clock.monotonic()
        ids = [ep.episode_id for g in groups for ep in g.episodes]
        samples = await asyncio.to_thread(self.store.samples_for, ids)
        batch: list[TrainSample] = []
        rewards: list[float] = []
        refs: list[tuple[str, int, str, float]] = []  # observe: (episode, sample index, agent, advantage) per sample
        agent_rewards: dict[str, list[float]] = defaultdict(list)
        version_before = self.engine.policy_version
        relaid: dict[int, tuple[list[int], list[int]]] = {}  # batch index -> (stored, used) masks, if they differ
        stale_tokens = bound_tokens = 0  # masked as stale, of the trained tokens before the bound
        for g in groups:
            advs = group_advantages(g, samples, self.config.loss.estimator, self.config.loss.scale_by_std)
            for ep in g.episodes:
                by_agent: dict[str, list[tuple[int, EpisodeSample]]] = defaultdict(list)
                for i, s in enumerate(samples[ep.episode_id]):
                    by_agent[s.agent].append((i, s))
                for agent, agent_samples in by_agent.items():
                    adv = advs[(ep.episode_id, agent)]
                    fresh = fresh_samples(agent_samples, version_before, self.settings.max_staleness)
                    stale_tokens, bound_tokens = stale_tokens + fresh.masked, bound_tokens + fresh.tokens
                    for i, kept in fresh.kept:
                        if kept is not samples[ep.episode_id][i]:
                            relaid[len(batch)] = (samples[ep.episode_id][i].loss_mask, kept.loss_mask)
                        batch.extend(to_train_samples([kept], adv))
                    refs.extend((ep.episode_id, i, agent, adv) for i, _ in fresh.kept)
                    rewards.append(episode_reward(ep.reward, agent))
                    agent_rewards[agent].append(rewards[-1])
        step = self.counters.train_steps + 1
        statuses = dict.fromkeys(ids, StoredStatus.TRAINED)
        if not any(s.num_trained_tokens for s in batch):  # nothing to learn from (no calls made)
            self.store.mark_consumed(statuses, step=None)
            return {}
        t1 = self.clock.monotonic()
        out = await self.engine.train_step(batch)
        metrics = dict(out)
        trainer_logprobs = out.trainer_logprobs if isinstance(out, StepOutput) else []
        t2 = self.clock.monotonic()
        staleness = [version_before - ep.min_policy_version for g in groups for ep in g.episodes]
        metrics = {**metrics, "reward_mean": sum(rewards) / max(len(rewards), 1), "groups": float(len(groups)),
                   "episodes": float(len(ids)), **self._type_metrics(groups),
                   **{f"reward_agent/{a}": sum(r) / len(r) for a, r in sorted(agent_rewards.items())},
                   **self._timing(t0, t1, t2, metrics), **staleness_metrics(staleness),
                   "staleness/masked_tokens": float(stale_tokens),
                   "staleness/masked_token_share": stale_tokens / bound_tokens if bound_tokens else 0.0}
        if self.observer is not None:
            metrics.update(self.observer.step_context(metrics))
        self.store.mark_consumed(statuses, step=step, step_record=(self.engine.policy_version, metrics))
        self.counters.train_steps = step
        self.counters.trained_episodes += len(ids)
        self.counters.trained_samples += len(batch)
        self.counters.trained_tokens += sum(s.num_trained_tokens for s in batch)
        self.counters.last_metrics = metrics
        log.info("step %d: policy v%d, %d episodes, reward %.3f, loss %.4f, %.1fs", step,
                 self.engine.policy_version, len(ids), metrics["reward_mean"], metrics.get("loss", 0.0),
                 metrics.get("step_seconds", 0.0))
        if self.observer is not None:
            record = StepRecord(step=step, policy_version=self.engine.policy_version, time=self.clock.time(),
                                metrics=metrics, staleness=staleness,
                                samples=[TrainedSample(eid, i, agent, adv, self._stored_layout(
                                    trainer_logprobs[k] if k < len(trainer_logprobs) else None, relaid.get(k)))
                                         for k, (eid, i, agent, adv) in enumerate(refs)])
            await asyncio.to_thread(self.observer.on_step, record)
        if self.settings.checkpoint_every and step % self.settings.checkpoint_every == 0:
            try:
                await asyncio.to_thread(self.save_checkpoint)
            except Exception:  # the step is committed: its episodes must not go back into the pool
                log.exception("checkpoint after step %d failed; training goes on, the next is tried on schedule",
                              step)
        return metrics

    @staticmethod
    def _stored_layout(lps: list[float] | None, masks: tuple[list[int], list[int]] | None) -> list[float] | None:
        """A sample's trainer logprobs, one per trained token of its stored loss mask (NaN where masked stale)."""
        return lps if masks is None else logprobs_on_stored_mask(lps, *masks)

    def _timing(self, t0: float, t1: float, t2: float, metrics: dict[str, float]) -> dict[str, float]:
        """The step's wall time split: waiting for a batch, preparing it, training, weight sync (engine-reported)."""
        sync = float(metrics.get("sync_seconds", 0.0))
        return {"time/waiting_s": self._waited_s, "time/prepare_s": t1 - t0,
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
            acc = self.counters.by_type.setdefault(t, {"episodes": 0.0, "reward_sum": 0.0})
            acc["episodes"] += len(mine)
            acc["reward_sum"] += sum(rewards)
        return out

    async def maybe_step(self) -> dict[str, float] | None:
        """Train once if a full batch of groups is ready."""
        if self.paused:
            return None
        self._drop_stale()
        batch = self.select_batch(self._drop_uniform(self.candidate_groups()))
        if batch is None:
            return None
        self._take(batch)
        self.in_step = sum(len(g.episodes) for g in batch)
        self._waited_s = self.clock.monotonic() - self._idle_since
        try:
            async with self.step_lock:
                metrics = await self.train_on(batch)
        except BaseException:
            for g in batch:  # not consumed: back into the pool
                for ep in g.episodes:
                    self.add(ep)
            raise
        finally:
            self.in_step = 0
            self._idle_since = self.clock.monotonic()
        if self.engine.halted_reason is not None:  # the step counted; the engine cannot go on: pause now
            raise TrainingHaltedError(self.engine.halted_reason)
        return metrics

    async def run(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)
            self._wake.clear()
            self._in_pass = True
            try:
                await self._one_pass()
            finally:
                self._in_pass = False
                self._passes += 1
                async with self._pass_done:
                    self._pass_done.notify_all()

    async def _one_pass(self) -> None:
        try:
            while not self._stopping and await self.maybe_step():
                self._capacity_changed()
            self._capacity_changed()  # stale or uniform groups dropped: their places are free
        except TrainingHaltedError as exc:  # going on would train on wrong data: pause, say why, once
            if self.counters.halted_reason != str(exc):
                log.error("training halted (paused): %s", exc)
            self.counters.halted_reason = str(exc)
            self.paused = True
        except Exception:  # a failed step must not kill the loop; the episodes stay pending
            log.exception("train step failed; its episodes stay in the store")
            await asyncio.sleep(1.0)

    async def settled(self) -> None:
        """Return once the train loop has made a whole pass over the pool that began after this call: it has
        trained every batch that was ready then, or passed them by (paused, halted, a failed step), and gone idle.
        So "nothing trained" is shown by an event, not by waiting a while."""
        target = self._passes + (2 if self._in_pass else 1)
        self._wake.set()
        async with self._pass_done:
            await self._pass_done.wait_for(lambda: self._passes >= target or self._task is None or self._task.done())

    def _capacity_changed(self) -> None:
        if self.on_capacity is not None:
            self.on_capacity()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task

    # ------------------------------------------------------------ checkpoints
    async def checkpoint_now(self) -> Path:
        """Save a checkpoint between train steps (for the control plane)."""
        async with self.step_lock:
            return await asyncio.to_thread(self.save_checkpoint)

    def save_checkpoint(self) -> Path:
        step = self.counters.train_steps
        target = self.checkpoint_dir / f"step-{step:06d}"
        tmp = self.checkpoint_dir / f".tmp-step-{step:06d}"
        if tmp.exists():
            shutil.rmtree(tmp)
        self.engine.save(tmp)
        state = {"train_steps": step, "policy_version": self.engine.policy_version,
                 "dropped_stale": self.counters.dropped_stale, "dropped_uniform": self.counters.dropped_uniform,
                 "trained_episodes": self.counters.trained_episodes, "saved_at": self.clock.time()}
        (tmp / CHECKPOINT_STATE).write_text(json.dumps(state, indent=2))
        run = {"model": self.config.model, "model_revision": self.config.model_revision,
               "served_model_name": self.config.name, "settings": self.config.public_dict()}
        (tmp / CHECKPOINT_RUN).write_text(json.dumps(run, indent=2, default=str))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
        pointer = self.checkpoint_dir / ".latest.tmp"  # write-then-rename: a crash never leaves a torn pointer
        pointer.write_text(target.name)
        pointer.replace(self.checkpoint_dir / "latest")
        self._prune_checkpoints()
        log.info("checkpoint saved: %s", target)
        return target

    def _prune_checkpoints(self) -> None:
        ckpts = sorted(p for p in self.checkpoint_dir.glob("step-*") if p.is_dir())
        for old in ckpts[: -self.settings.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    def latest_checkpoint(self) -> Path | None:
        pointer = self.checkpoint_dir / "latest"
        if pointer.exists():
            path = self.checkpoint_dir / pointer.read_text().strip()
            if (path / CHECKPOINT_STATE).exists():
                return path
        return None

    def resume_from_checkpoint(self) -> int:
        """Load the latest checkpoint (if any) and rewind the store to it. Returns the restored step."""
        ckpt = self.latest_checkpoint()
        step = 0
        if ckpt is not None:
            self.engine.load(ckpt)
            state = json.loads((ckpt / CHECKPOINT_STATE).read_text())
            step = int(state["train_steps"])
            self.counters.train_steps = step
            self.counters.dropped_stale = int(state.get("dropped_stale", 0))
            self.counters.dropped_uniform = int(state.get("dropped_uniform", 0))
            self.counters.trained_episodes = int(state.get("trained_episodes", 0))
        rewound = self.store.rewind_to_step(step)
        log.info("resumed at step %d (checkpoint %s); %d episodes consumed after it are pending again", step,
                 ckpt, rewound)
        return step
