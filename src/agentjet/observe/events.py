"""What the server's hooks hand to the observe room: plain data, no behaviour."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


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
    adapter: str | None = None  # the LoRA adapter it trained (a server with several); its steps count on their own


class StepObserver(Protocol):
    """The trainer's hook (``BatchStep.observer``)."""

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
