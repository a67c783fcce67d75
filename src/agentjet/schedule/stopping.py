"""When to stop training: a plateau of the held-out eval, or a run of groups that teach nothing.

- ``EVAL_PLATEAU``: ``patience`` periodic evals in a row without beating the best eval so far by
  ``min_delta`` (after at least ``min_evals`` evals);
- ``NO_SIGNAL``: at least ``uniform_share`` of the last ``window`` groups had all rewards equal (all right or
  all wrong: GRPO skips them, so generating more of them only burns time);
- ``SOLVED``: the curriculum has retired every task.
"""

from __future__ import annotations

import enum
from collections import deque

from pydantic import BaseModel, ConfigDict, Field


class StopReason(enum.StrEnum):
    EVAL_PLATEAU = "eval_plateau"
    NO_SIGNAL = "no_signal"
    SOLVED = "solved"


class StopSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    patience: int = Field(3, ge=1, description="evals in a row without a gain of min_delta over the best")
    min_delta: float = Field(0.02, ge=0)
    min_evals: int = Field(3, ge=1, description="evals before the plateau rule may stop (the first is the base model)")
    uniform_share: float = Field(0.9, gt=0, le=1, description="share of uniform groups in the window that stops")
    window: int = Field(48, ge=1, description="recent groups the uniform share is taken over")


class StoppingRule:
    def __init__(self, settings: StopSettings | None = None) -> None:
        self.settings = settings or StopSettings()
        self.evals: list[float] = []
        self._groups: deque[bool] = deque(maxlen=self.settings.window)
        self._since_best = 0
        self._best = float("-inf")

    def observe_eval(self, value: float) -> None:
        self.evals.append(value)
        if value > self._best + self.settings.min_delta or not self.evals[:-1]:
            self._best = max(value, self._best)
            self._since_best = 0
        else:
            self._since_best += 1

    def observe_group(self, rewards: list[float]) -> None:
        self._groups.append(len(set(rewards)) <= 1)

    @property
    def uniform_share(self) -> float:
        return sum(self._groups) / len(self._groups) if self._groups else 0.0

    @property
    def best_eval(self) -> float | None:
        return max(self.evals) if self.evals else None

    def check(self, curriculum_exhausted: bool = False) -> StopReason | None:
        s = self.settings
        if curriculum_exhausted:
            return StopReason.SOLVED
        if len(self._groups) >= s.window and self.uniform_share >= s.uniform_share:
            return StopReason.NO_SIGNAL
        if len(self.evals) >= s.min_evals and self._since_best >= s.patience:
            return StopReason.EVAL_PLATEAU
        return None
