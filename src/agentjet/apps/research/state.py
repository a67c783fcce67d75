"""The study on disk: a state machine per run, written atomically after every change.

    <study dir>/study.json        the spec digest, the configurations (and why each was tried), every run
    <study dir>/spec.yaml         the study spec as resolved
    <study dir>/results.tsv|json  one row per run (the results table: :mod:`agentjet.apps.research.results`)
    <study dir>/trials/<run>/attempt-<n>/   trial.yaml (an `ajet up` spec), logs, the client's result.json

A run moves planned -> running -> done | failed | pruned. Done, failed and pruned are final: a final run
is never started again, whatever happens to the process that runs the study.
"""

from __future__ import annotations

import enum
import fcntl
import math
import os
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

from agentjet.apps.research.spec import Aggregate, Metric, Scalar, StudySpec, StudySpecError
from agentjet.files import write_atomic
from agentjet.observe.learncurve import EvalPoint

STUDY_FILE = "study.json"


class TrialState(enum.StrEnum):
    PLANNED = "planned"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    PRUNED = "pruned"

    @property
    def final(self) -> bool:
        return self in (TrialState.DONE, TrialState.FAILED, TrialState.PRUNED)


_ALLOWED: dict[TrialState, set[TrialState]] = {
    TrialState.PLANNED: {TrialState.RUNNING, TrialState.PRUNED},  # pruned unstarted: a sibling seed was pruned
    TrialState.RUNNING: {TrialState.RUNNING, TrialState.DONE, TrialState.FAILED, TrialState.PRUNED},
    TrialState.DONE: set(),
    TrialState.FAILED: set(),
    TrialState.PRUNED: set(),
}


class IllegalTransition(RuntimeError):
    pass


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _point_from_stored(data: Any) -> Any:
    """A point as ``study.json`` and ``results.json`` keep it (``step``: the policy version, ``value``: the metric)."""
    if isinstance(data, dict) and "step" in data and "train_steps" not in data:
        return {"train_steps": data["step"], "policy_version": data["step"], "reward": data["value"]}
    return data


def stored_point(p: EvalPoint) -> dict[str, Any]:
    """The point in its stored shape (``step``, ``value``)."""
    return {"step": p.train_steps, "value": p.reward}


class Attempt(_Model):
    number: int
    started_at: float
    port: int
    pid: int | None = None
    create_time: float | None = Field(None, description="the process's start time: a reused pid is not ours")
    ended_at: float | None = None
    ready: bool = False
    outcome: str | None = None
    children: list[tuple[int, float]] = Field(default_factory=list, description="(pid, start time) of its "
                                              "servers and clients, to stop them if `ajet up` dies first")
    node: str | None = Field(None, description="where it ran, on a Ray cluster: the node's address and id")
    actor: str | None = Field(None, description="on a Ray cluster: the name of the actor that runs it")


class TrialRecord(_Model):
    id: str
    config_id: str
    seed: int
    params: dict[str, Scalar]
    state: TrialState = TrialState.PLANNED
    attempts: list[Attempt] = Field(default_factory=list)
    crashes: int = 0
    lost: int = Field(0, description="attempts whose node died (on a Ray cluster): retried, not counted as crashes")
    points: list[EvalPoint] = Field(default_factory=list, description="the run's metric at each eval point "
                                    "(reward: the metric, which may be the train reward); stored as step and value")
    reason: str = ""
    optuna_attrs: dict[str, Any] = Field(default_factory=dict, description="the planner's bookkeeping (ASHA rungs)")
    seconds: float = 0.0

    @field_validator("points", mode="before")
    @classmethod
    def _read_points(cls, v: Any) -> Any:
        return [_point_from_stored(p) for p in v] if isinstance(v, list) else v

    @field_serializer("points")
    def _write_points(self, points: list[EvalPoint]) -> list[dict[str, Any]]:
        return [stored_point(p) for p in points]

    def move(self, new: TrialState, reason: str = "") -> None:
        if new not in _ALLOWED[self.state]:
            raise IllegalTransition(f"run {self.id}: {self.state} -> {new} is not allowed")
        self.state = new
        if reason:
            self.reason = reason

    @property
    def attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def begin(self, attempt: Attempt) -> None:
        """A new attempt under way: the run is running, with none of the earlier attempts' points."""
        self.attempts.append(attempt)
        self.points = []
        self.move(TrialState.RUNNING)

    def add_point(self, step: int, value: float) -> bool:
        """Record an eval point; False if the step is already known."""
        if any(p.train_steps == step for p in self.points) or not math.isfinite(value):
            return False
        self.points.append(EvalPoint(train_steps=step, policy_version=step, reward=value))
        self.points.sort(key=lambda p: p.train_steps)
        return True

    def value(self, metric: Metric) -> float | None:
        """The run's metric: at the last eval point, or the best one; None before any point after step 0."""
        pts = [p for p in self.points if p.train_steps > 0] or []
        if not pts:
            return None
        if metric.aggregate is Aggregate.LAST:
            return pts[-1].reward
        values = [p.reward for p in pts]
        return max(values) if metric.direction == "maximize" else min(values)

    @property
    def last_step(self) -> int | None:
        return self.points[-1].train_steps if self.points else None


class ConfigRecord(_Model):
    id: str
    params: dict[str, Scalar]
    source: str = Field(description="default, tpe, random, grid, llm, or llm-fallback")
    why: str = Field(description="why it was tried: the baseline, the sampler's pick, or the LLM's hypothesis")
    created_at: float


class StudyState(_Model):
    digest: str
    created_at: float
    elapsed_s: float = Field(0.0, description="study time used by earlier sessions")
    sessions: int = 0
    configs: list[ConfigRecord] = Field(default_factory=list)
    trials: list[TrialRecord] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    finished: bool = False

    def config(self, config_id: str) -> ConfigRecord:
        return next(c for c in self.configs if c.id == config_id)

    def trial(self, trial_id: str) -> TrialRecord:
        return next(t for t in self.trials if t.id == trial_id)

    def by_state(self, *states: TrialState) -> list[TrialRecord]:
        return [t for t in self.trials if t.state in states]

    def add_config(self, params: dict[str, Scalar], source: str, why: str, seeds: int) -> ConfigRecord:
        config = ConfigRecord(id=f"c{len(self.configs):02d}", params=params, source=source, why=why,
                              created_at=time.time())
        self.configs.append(config)
        for seed in range(seeds):
            self.trials.append(TrialRecord(id=f"t{len(self.trials):03d}", config_id=config.id, seed=seed,
                                           params=dict(params)))
        return config

    def siblings(self, trial: TrialRecord) -> list[TrialRecord]:
        return [t for t in self.trials if t.config_id == trial.config_id and t.id != trial.id]

    def prune_unstarted(self, trial: TrialRecord, reason: str) -> None:
        """The other seeds of the trial's configuration that have not started are pruned with it."""
        for sibling in self.siblings(trial):
            if sibling.state is TrialState.PLANNED:
                sibling.move(TrialState.PRUNED, reason)


class StudyBusy(RuntimeError):
    """Another ``ajet research`` is running this study."""


class StudyStore:
    """Reads and writes a study directory. Every write is write-then-rename: a kill never tears a file."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock: Any = None

    def open(self, spec: StudySpec) -> StudyState:
        """Take the directory (:meth:`acquire`) and begin a session of ``spec``'s study in it: the state found there
        (refused when it is another study's: its digest differs), or a new one; ``spec.yaml`` written."""
        self.acquire()
        try:
            if self.exists():
                state = self.load()
                if state.digest != spec.digest():
                    raise StudySpecError(f"{self.root} holds a different study (its question, metric, base, client, "
                                         "space or seeds differ); give another output directory")
            else:
                state = StudyState(digest=spec.digest(), created_at=time.time())
            state.sessions += 1
            state.finished = False
            self.save_spec(spec)
            self.save(state)
        except BaseException:
            self.release()
            raise
        return state

    def acquire(self) -> None:
        """Hold the study for this process (released on exit, also by a kill): one runner per study."""
        self.root.mkdir(parents=True, exist_ok=True)
        handle = open(self.root / ".lock", "a+")  # noqa: SIM115 - held for the whole session
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            handle.close()
            raise StudyBusy(f"{self.root} is in use by another `ajet research` (pid {holder})") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._lock = handle

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    @property
    def state_path(self) -> Path:
        return self.root / STUDY_FILE

    def exists(self) -> bool:
        return self.state_path.exists()

    def load(self) -> StudyState:
        return StudyState.model_validate_json(self.state_path.read_text())

    def save(self, state: StudyState) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomic(self.state_path, state.model_dump_json(indent=1))

    def save_spec(self, spec: StudySpec) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomic(self.root / "spec.yaml", yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))

    def attempt_dir(self, trial: TrialRecord, number: int) -> Path:
        return self.root / "trials" / trial.id / f"attempt-{number}"
