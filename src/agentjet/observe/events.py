"""What the server's hooks hand to the observe room: plain data, no behaviour."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class TrainedSample:
    """The trainer's view of one stored sample in one train step."""

    episode_id: str
    sample_index: int  # position in the episode's stored samples (the trace's order)
    agent: str
    advantage: float
    trainer_logprobs: list[float] | None  # per trained token (loss_mask == 1), in order; None: engine gave none


@dataclass(frozen=True)
class StepRecord:
    step: int
    policy_version: int  # after the step
    time: float  # unix seconds
    metrics: dict[str, float]
    staleness: list[int] = field(default_factory=list)  # per trained episode: versions between generation and step
    samples: list[TrainedSample] = field(default_factory=list)


@dataclass
class TrackingTotals:
    """Context tracking summed over the episodes stored since start (from each episode's TrackingReport)."""

    episodes: int = 0
    calls: int = 0
    samples: int = 0
    merged_calls: int = 0
    drift_found: int = 0
    drift_repaired: int = 0
    tokens_merged: int = 0
    tokens_unmerged: int = 0

    def add(self, report: dict[str, Any]) -> None:
        self.episodes += 1
        self.calls += int(report.get("calls", 0))
        self.samples += int(report.get("samples", 0))
        self.merged_calls += int(report.get("merged_calls", 0))
        self.drift_found += int(report.get("drift_mismatches", 0))
        self.drift_repaired += int(report.get("drift_repaired", 0))
        self.tokens_merged += int(report.get("tokens_merged", 0))
        self.tokens_unmerged += int(report.get("tokens_unmerged", 0))

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class StepObserver(Protocol):
    """The trainer's hook (``Trainer.observer``)."""

    def step_context(self, metrics: dict[str, float]) -> dict[str, float]:
        """Server-wide figures to store with the step being recorded (rates, drops, merging); ``metrics``: the
        step's own metrics so far."""
        ...

    def on_step(self, record: StepRecord) -> None:
        """Called in a worker thread once the step is durable."""
        ...


def staleness_metrics(staleness: Sequence[int]) -> dict[str, float]:
    """Mean, max and a histogram (``staleness/hist/<versions>``) of the trained episodes' staleness."""
    if not staleness:
        return {}
    out = {"staleness/mean": sum(staleness) / len(staleness), "staleness/max": float(max(staleness))}
    for s in staleness:
        key = f"staleness/hist/{s}"
        out[key] = out.get(key, 0.0) + 1.0
    return out
