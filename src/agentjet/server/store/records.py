"""What the store holds, as records: an episode's stored status and row, what its trace shows, a train step, an
eval episode's reward; and the one error a failed durable write raises. No SQL here (``schema.py``, ``rows.py``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, NamedTuple


class StoredStatus(enum.StrEnum):
    PENDING = "pending"
    TRAINED = "trained"
    DROPPED_STALE = "dropped_stale"
    DROPPED_UNIFORM = "dropped_uniform"
    EVAL = "eval"
    PREPARED = "prepared"  # team episode after phase one: durable, not trainable until committed
    ABORTED = "aborted"  # a prepared team episode whose team aborted


CONSUMED = (StoredStatus.TRAINED, StoredStatus.DROPPED_STALE, StoredStatus.DROPPED_UNIFORM)  # what a step leaves


@dataclass(frozen=True)
class StoredEpisode:
    episode_id: str
    key_hash: str
    client_id: str
    task_id: str
    task_type: str
    group_key: str
    reward: float | dict[str, float]
    status: StoredStatus
    n_calls: int
    n_samples: int
    begin_policy_version: int
    min_policy_version: int
    ended_at: float
    commit_status: StoredStatus | None = None  # for PREPARED: what it becomes on commit (pending or eval)
    team_id: str | None = None
    team_coordinator: str | None = None  # None on the coordinator itself
    team_secret: str | None = None
    # The newest policy version that generated any of its tokens (None: stored before it was kept; then
    # ``min_policy_version`` stands for every token).
    max_policy_version: int | None = None

    @property
    def newest_version(self) -> int:
        return self.max_policy_version if self.max_policy_version is not None else self.min_policy_version


@dataclass(frozen=True)
class TraceRow:
    episode: StoredEpisode
    consumed_step: int | None
    metadata: dict[str, Any]
    report: dict[str, Any] | None  # the tracking report (merge and drift statistics)


class StepRecord(NamedTuple):
    """One committed train step: the one policy's, or one LoRA adapter's."""

    step: int
    policy_version: int
    metrics: dict[str, float]
    created_at: float


class EvalReward(NamedTuple):
    """One eval episode's reward, with the policy version it began at, its task type, and the difficulty level the
    client noted for it (``metadata.level``; None: none)."""

    policy_version: int
    task_type: str
    reward: float | dict[str, float]
    level: int | None = None


class StoreError(RuntimeError):
    """The store cannot durably accept data (disk full, read-only, ...)."""
