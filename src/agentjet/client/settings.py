"""A training run's client-side settings, declared once: how many episodes run at once and in which groups, when
training stops, when it pauses for a held-out eval, whether the best eval's checkpoint is pinned, and when a task
type's difficulty level moves (``level_rule``: the window and thresholds, ``agentjet.schedule.LevelSettings``, used
when a run has levels on).

The driver (``agentjet.client.driver.Driver``) and a scheduled run (``agentjet.client.scheduled.run_scheduled``)
take a :class:`RunSettings`; the apps compose it (``ajet demo``'s ``DemoSettings.run``, and through the demo
``ajet bench --learn``), and ``ajet demo``'s options are generated from it, as ``ajet server``'s are from the
server's settings. Each field has its bounds and its description here. This sits on the client's floor, so it
imports nothing of the server's settings (``agentjet.settings``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentjet.schedule.levels import LevelSettings


@dataclass(frozen=True)
class PauseAt:
    """Pause once the training clock reaches each of ``seconds``, and once the server has taken each of
    ``steps`` train steps. A point at or past the budget still pauses, before the run stops."""

    seconds: tuple[float, ...] = ()
    steps: tuple[int, ...] = ()


@dataclass(frozen=True)
class PauseEvery:
    """Pause every ``seconds`` of training time, and/or every ``steps`` train steps, strictly inside the budget."""

    seconds: float | None = None
    steps: int | None = None

    def __post_init__(self) -> None:
        if (self.seconds is not None and self.seconds <= 0) or (self.steps is not None and self.steps < 1):
            raise ValueError(f"PauseEvery needs seconds > 0 and steps >= 1, got {self}")


Pauses = PauseAt | PauseEvery


@dataclass(frozen=True)
class Budget:
    max_steps: int | None = None  # the server's train steps
    train_seconds: float | None = None  # the training clock


class RunSettings(BaseModel):
    """A run's client-side settings (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group_size: int | None = Field(None, ge=1, description="episodes per task (a GRPO group); none: the server's")
    concurrency: int = Field(32, ge=1, le=4096, description="training episodes in flight")
    max_steps: int | None = Field(None, ge=1, description="stop after this many train steps (the server's count)",
                                  json_schema_extra={"flag": "steps", "aliases": ["max-steps"]})
    time_budget_s: float | None = Field(20 * 60.0, gt=0, description="stop after this much training time, in "
                                        "seconds: the clock since training started less the pauses for evals "
                                        "(none: no limit)")
    eval_every_s: float | None = Field(None, ge=0, description="a held-out eval every this many seconds of "
                                       "training time, strictly inside the budget (none or 0: only before and "
                                       "after training)")
    eval_every_steps: int | None = Field(None, ge=1, description="a held-out eval every this many train steps, "
                                         "strictly inside the budget (with eval_every_s: at both)")
    eval_at_s: tuple[float, ...] = Field((), description="held-out evals at these training times, in seconds, "
                                         "instead of the periodic ones (comma-separated)")
    eval_at_steps: tuple[int, ...] = Field((), description="held-out evals at these train steps, instead of the "
                                           "periodic ones (comma-separated)")
    gate_timeout_s: float = Field(120.0, gt=0, description="the longest wait for the training episodes in flight "
                                  "to finish before an eval")
    poll_s: float = Field(1.0, gt=0, description="seconds between status polls (a train step may slip in between "
                          "a poll and a pause)")
    quiet_s: float = Field(60.0, gt=0, description="report after this many seconds without a train step")
    keep_best: bool = Field(False, description="after each eval (training paused), pin the step's checkpoint as "
                            "the run's best when the eval beats the pinned one's (a full checkpoint at each new "
                            "best; the admin token; `ajet export RUN --best`)")
    level_rule: LevelSettings = Field(default_factory=LevelSettings, description="when a task type's difficulty "
                                      "level moves, with levels on (ajet demo --levels); a value not set here is "
                                      "the task's recommendation (Recommended.levels), else the default")

    @field_validator("eval_at_s", "eval_at_steps", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        """``"60,120"`` (a command-line value) -> ``["60", "120"]``; anything else is left to pydantic."""
        return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value

    def pauses(self) -> Pauses | None:
        """The pause points: ``eval_at_*``, else the periodic ones, else none (evals before and after only)."""
        if self.eval_at_s or self.eval_at_steps:
            return PauseAt(seconds=self.eval_at_s, steps=self.eval_at_steps)
        if self.eval_every_s or self.eval_every_steps:
            return PauseEvery(seconds=self.eval_every_s or None, steps=self.eval_every_steps)
        return None

    def budget(self) -> Budget:
        return Budget(max_steps=self.max_steps, train_seconds=self.time_budget_s)
