"""The server's counters: the write side of its one read model.

Every figure that the status (``GET /swarm/v1/status``), the dashboard and the Prometheus metrics show and that
the server counts itself lives here, one typed object per concern, gathered in one ``RunCounters``. Each counter
is written in exactly one method of its object (a checkpoint's counters come back through
``TrainingCounters.restore``, the one restore), and the writers hold the object they write:

==========================  ===============================================  ======================================
object                      counts                                           written by
==========================  ===============================================  ======================================
``RequestCounters``         chat calls, generated tokens, episodes ended     ``ingest.Ingest``
``TitoCounters``            token-in, token-out splices and fallbacks        ``ingest.Ingest.tito_prompt_ids``
``TrackingTotals``          context tracking over the stored episodes        ``ingest.Ingest`` (the durable write)
``AdmissionCounters``       begins refused at capacity, begins held          ``admission.Admission``
``TrainingCounters``        steps, trained and dropped episodes, last step,  ``training.step`` and ``.pool``
                            seconds in train steps and weight pushes
``TaskLevels``              the difficulty level noted on each task type's   ``ingest.Ingest`` (the durable write)
                            latest training episode
==========================  ===============================================  ======================================

The episode registry keeps its own lifecycle counts (``registry.counts``: begun, expired, aborted, released),
each written once in ``registry.py``; the weight-sync counts belong to the engine (``Engine.weight_sync``).
The read side turns all of them into one ``RunSnapshot`` (``run_state.snapshot``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentjet.runtime.clock import Clock
from agentjet.tracking.drift import TitoOutcome


@dataclass
class RequestCounters:
    """The request path: chat calls served, tokens generated for them, episodes ended and acknowledged."""

    started: float  # clock.monotonic() when the server's counters began
    calls: int = 0
    generated_tokens: int = 0
    episodes_ended: int = 0

    def call(self, generated_tokens: int) -> None:
        self.calls += 1
        self.generated_tokens += generated_tokens

    def episode_ended(self) -> None:
        self.episodes_ended += 1


@dataclass
class TitoCounters:
    """Token-in, token-out at request time (``tito.py``)."""

    prompts_spliced: int = 0  # requests whose prompt holds generated ids that re-tokenization would have changed
    drift_prevented: int = 0  # assistant messages whose re-tokenization differed from the generated ids
    fallbacks: int = 0

    def count(self, outcome: TitoOutcome, drift: int) -> None:
        if outcome is TitoOutcome.SPLICED:
            self.prompts_spliced += 1
            self.drift_prevented += drift
        elif outcome is TitoOutcome.FALLBACK:
            self.fallbacks += 1

    def as_dict(self) -> dict[str, float]:
        return {"tito_prompts_spliced": self.prompts_spliced, "tito_drift_prevented": self.drift_prevented,
                "tito_fallbacks": self.fallbacks}


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

    def add(self, report: Mapping[str, Any]) -> None:
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


@dataclass
class AdmissionCounters:
    """Admission within the staleness bound (``admission.py``)."""

    refusals: int = 0  # training begins answered 429 at_capacity (at once, or after their whole wait)
    held: int = 0  # begins that waited on the server before they were answered

    def refused(self) -> None:
        self.refusals += 1

    def held_begin(self) -> None:
        self.held += 1


@dataclass
class TypeTotals:
    """Trained episodes of one task type and the sum of their mean rewards."""

    episodes: int = 0
    reward_sum: float = 0.0

    @property
    def reward_mean(self) -> float:
        return self.reward_sum / max(self.episodes, 1)


# What a checkpoint keeps of the training counters (``trainer_state.json``; read back by ``restore``).
CHECKPOINTED = ("train_steps", "trained_episodes", "dropped_stale", "dropped_uniform")
# Counters that ``restore`` reads back from another key of the checkpoint's state: the committed version is the
# policy version the checkpoint saved (a checkpoint is taken between steps, so it was committed).
RESTORED_FROM = {"committed_version": "policy_version"}


@dataclass
class TrainingCounters:
    """The training core (``training/``). Cumulative since the run began: the checkpointed ones survive a resume."""

    train_steps: int = 0
    committed_version: int = 0  # the learner's policy version after the latest committed step
    trained_episodes: int = 0
    trained_samples: int = 0
    trained_tokens: int = 0
    # wall seconds of the committed steps (since start, not checkpointed): in the engine's train step but its
    # weight push (a step's ``time/training_s``), and in the push to the generator (``time/sync_s``: the seam's
    # ``sync_seconds``, 0 for a seam that moves nothing)
    train_seconds: float = 0.0
    weight_sync_seconds: float = 0.0
    dropped_stale: int = 0
    dropped_uniform: int = 0
    last_metrics: dict[str, float] = field(default_factory=dict)
    halted_reason: str | None = None  # set when the engine said training must stop (training is paused)
    by_type: dict[str, TypeTotals] = field(default_factory=dict)

    def stepped(self, step: int, episodes: int, samples: int, tokens: int, metrics: dict[str, float],
                version: int, train_s: float = 0.0, sync_s: float = 0.0) -> None:
        """A train step was committed: its episodes are trained, and ``version`` (the learner's after it) too.
        ``train_s``: the step's wall time in the engine but the weight push; ``sync_s``: the push's."""
        self.train_steps = step
        self.committed_version = version
        self.trained_episodes += episodes
        self.trained_samples += samples
        self.trained_tokens += tokens
        self.train_seconds += train_s
        self.weight_sync_seconds += sync_s
        self.last_metrics = metrics

    def served_version(self, generator_version: int) -> int:
        """The version a client is told about: its step is committed and the generator holds its weights."""
        return min(self.committed_version, generator_version)

    def trained_type(self, task_type: str, episodes: int, reward_sum: float) -> None:
        totals = self.by_type.setdefault(task_type, TypeTotals())
        totals.episodes += episodes
        totals.reward_sum += reward_sum

    def drop_stale(self, episodes: int) -> None:
        self.dropped_stale += episodes

    def drop_uniform(self, episodes: int) -> None:
        self.dropped_uniform += episodes

    def halt(self, reason: str) -> bool:
        """Training stopped by itself; returns whether the reason is new (to log it once)."""
        new = reason != self.halted_reason
        self.halted_reason = reason
        return new

    def checkpoint_state(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in CHECKPOINTED}

    def restore(self, state: Mapping[str, Any]) -> None:
        """The counters a checkpoint kept (``checkpoint_state``, and the committed version from its policy
        version); the others start again from zero."""
        for name, key in [*((n, n) for n in CHECKPOINTED), *RESTORED_FROM.items()]:
            setattr(self, name, int(state.get(key, 0)))


@dataclass
class TaskLevels:
    """Where each task type's training is on its difficulty levels (``agentjet.schedule.levels``): the level a
    client noted on the type's latest stored training episode (``Episode.note(level=...)``, the end's
    ``metadata.level``, an integer). Eval episodes do not move it: a levelled run scores its evals at two levels.
    Not checkpointed: after a restart a type shows its level again from its next episode."""

    latest: dict[str, int] = field(default_factory=dict)

    def noted(self, task_type: str, metadata: Mapping[str, Any]) -> None:
        level = metadata.get("level")
        if isinstance(level, int) and not isinstance(level, bool) and level >= 0:
            self.latest[task_type] = level


@dataclass
class RunCounters:
    """Every counter of one server, by concern. Built once by ``SwarmServer`` and handed to each writer."""

    requests: RequestCounters
    tito: TitoCounters = field(default_factory=TitoCounters)
    tracking: TrackingTotals = field(default_factory=TrackingTotals)
    admission: AdmissionCounters = field(default_factory=AdmissionCounters)
    training: TrainingCounters = field(default_factory=TrainingCounters)
    levels: TaskLevels = field(default_factory=TaskLevels)

    @classmethod
    def starting_now(cls, clock: Clock) -> RunCounters:
        return cls(requests=RequestCounters(started=clock.monotonic()))
