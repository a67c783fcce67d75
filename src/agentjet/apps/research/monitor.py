"""Watching one run through its server's status API: its eval points and its health.

Pure functions of what was observed and a clock value, so the timing rules are tested with a fake clock.

An eval point is the server's mean eval-episode reward at one policy version. The trial client pauses
training while it evaluates, so the point at version v is complete once the policy has moved past v
(training resumed), or once the client has finished and written its result.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from agentjet.apps.research.spec import MetricSource
from agentjet.observe.learncurve import EvalPoint
from agentjet.protocol import ServerStatus

RESULT_FILE = "result.json"


class Health(enum.StrEnum):
    STARTING = "starting"  # launched; the server has not answered yet
    RUNNING = "running"
    FINISHED = "finished"  # the client wrote its result
    CRASHED = "crashed"  # the process ended without a result
    START_TIMEOUT = "start_timeout"
    STALLED = "stalled"  # no progress for stall_s
    NAN_LOSS = "nan_loss"
    TIMED_OUT = "timed_out"  # ran past the run's hard limit

    @property
    def retryable(self) -> bool:
        return self in (Health.CRASHED, Health.START_TIMEOUT, Health.STALLED)


def _legacy_eval(data: Any) -> Any:
    """Records written before the driver had no clocks, ``seconds`` for the eval's duration and ``episodes``
    counting the failed ones."""
    if isinstance(data, dict) and "eval_seconds" not in data and "train_seconds" not in data:
        data = {**data, "eval_seconds": data.get("seconds", 0.0), "seconds": 0.0,
                "episodes": data.get("episodes", 0) - data.get("failed", 0)}
    return data


# An eval point as ``result.json`` and ``evals.jsonl`` keep it: the one eval record, reading the older ones too.
EvalRecord = Annotated[EvalPoint, BeforeValidator(_legacy_eval)]
_EVAL_RECORD: TypeAdapter[EvalPoint] = TypeAdapter(EvalRecord)


def read_eval_record(data: Any) -> EvalPoint:
    """An eval point of ``result.json`` / ``evals.jsonl``, of any version."""
    return _EVAL_RECORD.validate_python(data)


class TrialResult(BaseModel):
    """What the trial client leaves in its attempt directory when it finishes."""

    model_config = ConfigDict(extra="forbid")
    ok: bool = True
    stop_reason: str = Field(description="steps reached, or the time budget")
    evals: list[EvalRecord] = Field(default_factory=list)
    final_status: dict[str, Any] = Field(default_factory=dict, description="the server's status at the end")
    train_episodes: int = 0
    failed_episodes: int = 0
    seconds: float = 0.0


def parse_status(data: Any) -> ServerStatus:
    """A status answer; a NaN or infinite train metric comes as null (JSON has no NaN) and is read as NaN."""
    if isinstance(data, dict) and isinstance(data.get("last_train_metrics"), dict):
        metrics = {k: float("nan") if v is None else v for k, v in data["last_train_metrics"].items()}
        data = {**data, "last_train_metrics": metrics}
    return ServerStatus.model_validate(data)


def read_result(attempt_dir: Path) -> TrialResult | None:
    path = attempt_dir / RESULT_FILE
    try:
        return TrialResult.model_validate_json(path.read_text())
    except (OSError, ValidationError, ValueError):
        return None


def eval_points(status: ServerStatus, source: MetricSource, final: bool = False) -> dict[int, float]:
    """The complete eval points in a status: {policy version: value}."""
    if source is MetricSource.TRAIN_REWARD:
        value = status.last_train_metrics.get("reward_mean")
        if value is None or status.train_steps == 0:
            return {}
        return {status.train_steps: float(value)}
    out = {}
    for version, reward in status.eval_reward.items():
        v = int(version)
        if (final or v < status.policy_version) and math.isfinite(reward):
            out[v] = float(reward)
    return out


def result_points(result: TrialResult, source: MetricSource) -> dict[int, float]:
    """All eval points of a finished run: the server's final status, else the client's own records."""
    try:
        status = parse_status(result.final_status)
    except ValidationError:
        status = None
    if status is not None:
        points = eval_points(status, source, final=True)
        if points or source is MetricSource.TRAIN_REWARD:
            return points
    if source is MetricSource.EVAL_REWARD:
        return {e.policy_version: e.reward for e in result.evals
                if e.policy_version is not None and math.isfinite(e.reward)}
    return {}


def _signature(status: ServerStatus) -> tuple[int, ...]:
    b = status.buffer
    return (status.train_steps, b.trained_episodes, b.pending_episodes, b.dropped_stale_episodes,
            b.dropped_uniform_episodes, b.eval_episodes, b.aborted_episodes, b.expired_episodes, b.open_episodes,
            int(status.throughput.get("calls", 0)))


@dataclass
class Watch:
    """What has been seen of one attempt, on a monotonic clock."""

    started: float
    ready: bool = False
    progress_at: float = 0.0
    signature: tuple[int, ...] = field(default_factory=tuple)
    last_status: ServerStatus | None = None

    def observe(self, status: ServerStatus | None, now: float) -> None:
        if status is None:
            return
        sig = _signature(status)
        if not self.ready or sig != self.signature:
            self.progress_at = now
        self.ready = True
        self.signature = sig
        self.last_status = status


@dataclass(frozen=True)
class Limits:
    start_timeout_s: float
    stall_s: float
    run_timeout_s: float


def judge(watch: Watch, alive: bool, result: TrialResult | None, now: float, limits: Limits) -> Health:
    """The attempt's health from what was observed; the first matching rule wins."""
    status = watch.last_status
    if status is not None:
        loss = status.last_train_metrics.get("loss")
        if loss is not None and not math.isfinite(loss):
            return Health.NAN_LOSS
    if result is not None and result.ok:
        return Health.FINISHED
    if not alive:
        return Health.CRASHED
    if now - watch.started > limits.run_timeout_s:
        return Health.TIMED_OUT
    if not watch.ready:
        return Health.START_TIMEOUT if now - watch.started > limits.start_timeout_s else Health.STARTING
    if now - watch.progress_at > limits.stall_s:
        return Health.STALLED
    return Health.RUNNING
