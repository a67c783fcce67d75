"""The group pool: acknowledged training episodes waiting for a train step.

Episodes are grouped by group key (the task id unless the client set a group id). A group is ready when it holds
``group_size`` episodes, or ``min_group_size`` after ``group_timeout_s``. A batch takes ``batch_groups`` ready
groups in admission order, within the task-type quotas (``candidate_groups``, ``select_batch``). Groups whose
rewards are all equal carry no signal and are dropped (``drop_uniform``); episodes whose tokens are all older
than ``max_staleness`` versions are dropped before batching (``drop_stale``). Both drops are durable and counted.

Admission reads the pool (what is pending per group and per type, the admission order, the quotas); the train
loop takes batches from it. It settles nothing itself: a taken batch is committed by ``step.BatchStep``, or handed
back with ``give_back``.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from agentjet.runtime.clock import Clock
from agentjet.server.counters import TrainingCounters
from agentjet.server.store import StoredEpisode, StoredStatus, TrainingStore
from agentjet.server.training.quotas import apportion
from agentjet.server.training.staleness import all_stale
from agentjet.settings import AbsentPolicy, TrainingSettings

log = logging.getLogger(__name__)

MAX_ADMISSION_ORDER = 100_000  # group keys remembered in the admission order before the oldest unused are pruned


@dataclass
class Group:
    key: str
    episodes: list[StoredEpisode]

    @property
    def task_type(self) -> str:
        return self.episodes[0].task_type

    @property
    def size(self) -> int:
        return len(self.episodes)


def is_uniform(group: Group) -> bool:
    rewards = [json.dumps(ep.reward, sort_keys=True) for ep in group.episodes]
    return len(set(rewards)) <= 1


class GroupPool:
    """``settings`` is read afresh at every use, so a live change takes effect from the next batch."""

    def __init__(self, settings: Callable[[], TrainingSettings], store: TrainingStore, counters: TrainingCounters,
                 clock: Clock) -> None:
        self._settings = settings
        self.store = store
        self.counters = counters  # the read model's training counters: the pool writes its drops there
        self.clock = clock
        self._pending: dict[str, list[StoredEpisode]] = defaultdict(list)
        self._first_seen: dict[str, float] = {}
        self.in_step = 0  # episodes taken by the step that is running (no longer pending, not yet trained)
        self.last_begin: dict[str, float] = {}  # task type -> monotonic time of its latest begin
        # admission order: group key -> its admission sequence number (batches take groups in this order)
        self._admitted: dict[str, int] = {}
        self._admitted_at: dict[str, float] = {}  # group key -> when its latest group was admitted (monotonic)
        self._admissions = 0

    @property
    def settings(self) -> TrainingSettings:
        return self._settings()

    # ------------------------------------------------------------ intake
    def add(self, ep: StoredEpisode) -> None:
        self._pending[ep.group_key].append(ep)
        self._first_seen.setdefault(ep.group_key, self.clock.monotonic())

    def load_pending(self) -> int:
        """Every pending episode of the store (at start-up)."""
        eps = self.store.pending_episodes()
        for ep in eps:
            self.add(ep)
        return len(eps)

    # ------------------------------------------------------------ what admission reads
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
        for eps in list(self._pending.values()):
            for ep in eps:
                counts[ep.task_type] += 1
        return counts

    def quotas(self) -> dict[str, int]:
        """Groups per batch for each task type (empty: no quotas)."""
        return apportion(self.settings.batch_groups, self.settings.task_ratios)

    @property
    def pending_count(self) -> int:
        return sum(map(len, list(self._pending.values())))  # one copy: the read side may count from a thread

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
                if not self._lent(t):
                    return None  # wait for this type's share
                short += q - len(take)
        if short:
            spare = [g for g in groups if g not in batch and g.task_type in quotas]
            if len(spare) < short:
                return None
            batch += spare[:short]
        return batch

    def next_batch(self, policy_version: int) -> list[Group] | None:
        """Drop what is stale at ``policy_version`` and what is uniform, then take the next batch out of the
        pool (its episodes count as ``in_step`` until ``settle`` or ``give_back``); None when none is ready."""
        self.drop_stale(policy_version)
        batch = self.select_batch(self.drop_uniform(self.candidate_groups()))
        if batch is not None:
            self.take(batch)
            self.in_step = sum(g.size for g in batch)
        return batch

    def settle(self) -> None:
        """The taken batch was committed (or failed and was handed back): nothing is in a step any more."""
        self.in_step = 0

    def give_back(self, batch: list[Group]) -> None:
        """A batch that was not consumed goes back into the pool."""
        for g in batch:
            for ep in g.episodes:
                self.add(ep)
        self.in_step = 0

    def take(self, groups: list[Group]) -> None:
        taken = {ep.episode_id for g in groups for ep in g.episodes}
        for key in {g.key for g in groups}:
            left = [ep for ep in self._pending.get(key, []) if ep.episode_id not in taken]
            self._set_group(key, left)
            if left:
                self._first_seen[key] = self.clock.monotonic()

    # ------------------------------------------------------------ drops
    def drop_stale(self, policy_version: int) -> None:
        """Episodes whose every token is more than ``max_staleness`` versions older than ``policy_version``."""
        stale: dict[str, StoredStatus] = {}
        for key in list(self._pending):
            keep = []
            for ep in self._pending[key]:
                if all_stale(ep, policy_version, self.settings.max_staleness):
                    stale[ep.episode_id] = StoredStatus.DROPPED_STALE
                else:
                    keep.append(ep)
            self._set_group(key, keep)
        if stale:
            self.store.mark_consumed(stale, step=self.counters.train_steps)
            self.counters.drop_stale(len(stale))
            log.info("dropped %d stale episodes (all their tokens older than %d versions)", len(stale),
                     self.settings.max_staleness)

    def drop_uniform(self, groups: list[Group]) -> list[Group]:
        """Consume groups whose rewards are all equal (no learning signal); return the others."""
        if not self.settings.drop_uniform_groups:
            return groups
        uniform = [g for g in groups if is_uniform(g)]
        if uniform:
            self.take(uniform)
            self.store.mark_consumed({ep.episode_id: StoredStatus.DROPPED_UNIFORM for g in uniform
                                      for ep in g.episodes}, step=self.counters.train_steps)
            self.counters.drop_uniform(sum(g.size for g in uniform))
        return [g for g in groups if not is_uniform(g)]

    def share_with_absent(self, task_type: str) -> int:
        """Groups per batch that ``task_type`` may have to supply: its own share, plus under the fill policy the
        shares of the absent types (their places in a batch go to present groups, of any type). Admission lets a
        type have two of these in flight, so a present type can fill whole batches while the others are away."""
        quotas = self.quotas()
        return quotas.get(task_type, 0) + sum(q for t, q in quotas.items() if t != task_type and self._lent(t))

    def _lent(self, task_type: str) -> bool:
        """Whether ``task_type``'s places in a batch go to other types' groups: under the fill policy, when it is
        absent (no episode of it begun for ``absent_after_s``)."""
        if self.settings.absent_policy is AbsentPolicy.STRICT:
            return False
        seen = self.last_begin.get(task_type)
        return seen is None or self.clock.monotonic() - seen > self.settings.absent_after_s

    def _set_group(self, key: str, eps: list[StoredEpisode]) -> None:
        if eps:
            self._pending[key] = eps
        else:
            self._pending.pop(key, None)
            self._first_seen.pop(key, None)
            self._admitted.pop(key, None)
            self._admitted_at.pop(key, None)
