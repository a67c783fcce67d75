"""A per-task curriculum: roll out the tasks that still teach something.

GRPO learns nothing from a group whose rewards are all equal. Once the model solves a task every time, each
new group of it is a wasted rollout (the server skips it). The curriculum follows each task's group results:

- a task whose last ``solved_after`` groups (default 1) all succeeded (every reward >= ``success``) is SOLVED: retired
  from the mix and only revisited with probability ``revisit`` (a failure there brings it back);
- a task whose last ``hard_after`` groups all failed is HARD: drawn with weight ``hard_weight``;
- the others (NEW, LEARNING) are drawn with weight 1.

As the group success rises the mix shifts to the tasks the model still gets wrong: the harder ones. When
no task is left to learn, ``exhausted`` is true (a stopping signal). Tasks whose group is in flight are
drawn last, so a group's result is usually known before the task is drawn again.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class TaskState(enum.StrEnum):
    NEW = "new"
    LEARNING = "learning"
    HARD = "hard"
    SOLVED = "solved"


class CurriculumSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    solved_after: int = Field(1, ge=1, description="consecutive all-success groups that retire a task")
    hard_after: int = Field(2, ge=1, description="consecutive all-failure groups that make a task HARD")
    success: float = Field(1.0, description="a reward at least this counts as a success")
    revisit: float = Field(0.05, ge=0, le=1, description="chance that a draw revisits a SOLVED task")
    hard_weight: float = Field(0.25, ge=0, description="draw weight of a HARD task (others: 1)")


@dataclass
class _Task:
    state: TaskState = TaskState.NEW
    win_streak: int = 0
    loss_streak: int = 0
    groups: int = 0
    in_flight: int = 0


class Curriculum:
    def __init__(self, keys: Iterable[str], settings: CurriculumSettings | None = None, seed: int = 0) -> None:
        self.settings = settings or CurriculumSettings()
        self._tasks: dict[str, _Task] = {k: _Task() for k in keys}
        if not self._tasks:
            raise ValueError("the curriculum needs at least one task")
        self._rng = random.Random(seed)

    # ------------------------------------------------------------ drawing
    def draw(self) -> str:
        """The key of the next task to roll out (a group of it), marked in flight until ``record``."""
        s = self.settings
        solved = [k for k, t in self._tasks.items() if t.state is TaskState.SOLVED]
        active = [k for k, t in self._tasks.items() if t.state is not TaskState.SOLVED]
        if solved and (not active or self._rng.random() < s.revisit):
            key = self._pick(solved)
        else:
            key = self._pick(active)
        self._tasks[key].in_flight += 1
        return key

    def _pick(self, keys: Sequence[str]) -> str:
        idle = [k for k in keys if self._tasks[k].in_flight == 0]
        pool = idle or list(keys)
        weights = [self.settings.hard_weight if self._tasks[k].state is TaskState.HARD else 1.0 for k in pool]
        if sum(weights) <= 0:
            return self._rng.choice(pool)
        return self._rng.choices(pool, weights=weights, k=1)[0]

    # ------------------------------------------------------------ results
    def record(self, key: str, rewards: Sequence[float]) -> TaskState:
        """A finished group of task ``key`` (its episodes' rewards); returns the task's new state."""
        t = self._tasks[key]
        t.in_flight = max(t.in_flight - 1, 0)
        if not rewards:
            return t.state
        t.groups += 1
        wins = [r >= self.settings.success for r in rewards]
        t.win_streak = t.win_streak + 1 if all(wins) else 0
        t.loss_streak = t.loss_streak + 1 if not any(wins) else 0
        if t.win_streak >= self.settings.solved_after:
            t.state = TaskState.SOLVED
        elif t.loss_streak >= self.settings.hard_after:
            t.state = TaskState.HARD
        else:
            t.state = TaskState.LEARNING
        return t.state

    def release(self, key: str) -> None:
        """A drawn group that produced no result (every episode failed): no longer in flight."""
        t = self._tasks[key]
        t.in_flight = max(t.in_flight - 1, 0)

    # ------------------------------------------------------------ reporting
    def state(self, key: str) -> TaskState:
        return self._tasks[key].state

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in TaskState}
        for t in self._tasks.values():
            out[t.state.value] += 1
        return out

    @property
    def exhausted(self) -> bool:
        """Every task is SOLVED: nothing left that a group could teach."""
        return all(t.state is TaskState.SOLVED for t in self._tasks.values())
