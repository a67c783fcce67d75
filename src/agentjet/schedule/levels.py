"""Difficulty levels: the rule that moves one task type up and down its levels by its recent group results.

"Curriculum" here already means the retirement of solved tasks (``agentjet.schedule.curriculum``). Levels are the
other axis: a task type's harder versions (more digits, a larger number range, a reasoning-gym curriculum level).
They compose: retirement works within a level (``agentjet.schedule.levelled`` keeps one ``Curriculum`` per level),
and this rule moves across levels. Levels are numbered ``0 .. top`` (0 the easiest).

A group is **full** when every reward is at least ``success``, **zero** when every reward is at most ``fail``,
else it has a signal (or is uniform at a partial reward, which counts as neither). The rule keeps the last
``window`` groups drawn at the current level (results of another level, groups still in flight when the level
moved, are ignored) and after each one:

- **probe** (at the start only): ``probe`` groups in a row full move the level up at once, ``probe`` groups in
  a row zero move it down, and the first group with a signal ends the probe: a new task starts where it gives
  signal. A probe that would turn back (up after down, or down after up) ends where it is;
- **rise**: the window is full and at least ``rise_share`` of it were full groups, or the caller says that at
  least ``rise_share`` of the level's tasks are retired as solved (``record(..., solved_share=)``: retirement
  draws the unsolved tasks, so on a small level the window alone would see mostly the hard ones). Never past
  ``top``;
- **fall**: the window is full and at least ``fall_share`` of it were zero groups, or the reward collapsed: the
  window's mean reward fell below ``collapse`` times the best window mean seen since the level was entered.
  Never below 0;
- **back-off**: each fall from level ``k`` multiplies the groups needed at ``k - 1`` before rising to ``k`` again
  by ``backoff`` (up to ``backoff ** 4``), so a level that is too hard is tried less and less often.

Pure Python (no server or client imports); tested in ``tests/schedule/test_levels.py``.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

MAX_BACKOFF_EXPONENT = 4


class LevelSettings(BaseModel):
    """When a task type's level moves (see the module docstring). Each task source recommends its own values
    (``Recommended.levels``); a value set here wins."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    FLAG_PREFIX: ClassVar[str] = "level"  # its command-line options: --level-window, --level-rise-share, ...

    window: int = Field(12, ge=1, le=10_000, description="recent groups at a level that its rise and fall are "
                        "judged on (counted since the level was entered)")
    rise_share: float = Field(0.75, gt=0, le=1, description="the level rises when at least this share of the "
                              "window's groups were uniform at full reward (or of the level's tasks are retired "
                              "as solved)")
    fall_share: float = Field(0.75, gt=0, le=1, description="the level falls back when at least this share of the "
                              "window's groups were uniform at zero reward")
    collapse: float = Field(0.5, ge=0, lt=1, description="the level also falls back when the window's mean reward "
                            "drops below this fraction of its best window mean since the level was entered (0: "
                            "off)")
    success: float = Field(1.0, description="a reward at least this is a full reward")
    fail: float = Field(0.0, description="a reward at most this is a zero reward")
    probe: int = Field(2, ge=1, le=100, description="at the start, this many groups in a row uniform at full (at "
                       "zero) move the level up (down) at once; the first group with a signal ends the probe")
    backoff: float = Field(2.0, ge=1, le=16, description="each fall from a level multiplies the groups needed "
                           "below it before it is tried again by this (up to its fourth power)")


class GroupKind(enum.StrEnum):
    FULL = "full"  # every reward >= success
    ZERO = "zero"  # every reward <= fail
    OTHER = "other"  # a signal, or uniform at a partial reward


class LevelMove(enum.StrEnum):
    PROBE_UP = "probe_up"
    PROBE_DOWN = "probe_down"
    RISE = "rise"
    FALL = "fall"


@dataclass(frozen=True)
class LevelChange:
    """A move of one task type's level, and why."""

    task_type: str
    old: int
    new: int
    move: LevelMove
    reason: str
    groups: int  # groups recorded at the old level since it was entered


class ProbeState(enum.Enum):
    PROBING = "probing"
    UP = "up"  # probing, having moved up (it may not turn down)
    DOWN = "down"  # probing, having moved down (it may not turn up)
    DONE = "done"


def group_kind(rewards: Sequence[float], settings: LevelSettings) -> GroupKind:
    if all(r >= settings.success for r in rewards):
        return GroupKind.FULL
    if all(r <= settings.fail for r in rewards):
        return GroupKind.ZERO
    return GroupKind.OTHER


@dataclass
class _AtLevel:
    """What the rule remembers of the current level since it was entered."""

    kinds: deque[GroupKind]
    means: deque[float]
    groups: int = 0
    run: int = 0  # the current streak of one kind (for the probe)
    run_kind: GroupKind | None = None
    best_mean: float = float("-inf")


@dataclass
class LevelRule:
    """One task type's level (see the module docstring): ``record`` each finished group with the level it was
    drawn at; it returns the move it made, if any."""

    top: int
    start: int = 0
    settings: LevelSettings = field(default_factory=LevelSettings)
    task_type: str = ""

    def __post_init__(self) -> None:
        if self.top < 0 or not 0 <= self.start <= self.top:
            raise ValueError(f"levels run from 0 to top >= 0 and start within them; got start {self.start}, top "
                             f"{self.top}")
        self.level = self.start
        self.probe = ProbeState.PROBING
        self.falls_from: dict[int, int] = {}
        self.history: list[LevelChange] = []
        self._at = self._fresh()

    def _fresh(self) -> _AtLevel:
        return _AtLevel(kinds=deque(maxlen=self.settings.window), means=deque(maxlen=self.settings.window))

    @property
    def highest(self) -> int:
        """The highest level reached so far."""
        return max([self.start, *(c.new for c in self.history)])

    def groups_to_rise(self) -> int:
        """Groups needed at the current level before it may rise: the window, times the back-off of the level
        above."""
        falls = min(self.falls_from.get(self.level + 1, 0), MAX_BACKOFF_EXPONENT)
        return max(self.settings.window, round(self.settings.window * self.settings.backoff ** falls))

    def record(self, level: int, rewards: Sequence[float], solved_share: float | None = None) -> LevelChange | None:
        """A finished group drawn at ``level``; ``solved_share``: the share of the level's tasks retired as solved
        (None: unknown). A group of another level than the current one is ignored."""
        if level != self.level or not rewards:
            return None
        kind = group_kind(rewards, self.settings)
        at = self._at
        at.groups += 1
        at.kinds.append(kind)
        at.means.append(sum(rewards) / len(rewards))
        at.run = at.run + 1 if kind is at.run_kind else 1
        at.run_kind = kind
        if self.probe is not ProbeState.DONE:
            return self._probe(kind)
        return self._judge(solved_share)

    def _probe(self, kind: GroupKind) -> LevelChange | None:
        s = self.settings
        if kind is GroupKind.OTHER:
            self.probe = ProbeState.DONE
            return None
        if self._at.run < s.probe:
            return None
        if kind is GroupKind.FULL:
            if self.probe is ProbeState.DOWN or self.level >= self.top:
                self.probe = ProbeState.DONE
                return None
            self.probe = ProbeState.UP
            return self._move(self.level + 1, LevelMove.PROBE_UP, f"{s.probe} groups in a row at full reward")
        if self.probe is ProbeState.UP or self.level <= 0:
            self.probe = ProbeState.DONE
            return None
        self.probe = ProbeState.DOWN
        return self._move(self.level - 1, LevelMove.PROBE_DOWN, f"{s.probe} groups in a row at zero reward")

    def _judge(self, solved_share: float | None) -> LevelChange | None:
        s, at = self.settings, self._at
        if len(at.kinds) < s.window:
            return None
        mean = sum(at.means) / len(at.means)
        best = at.best_mean
        at.best_mean = max(best, mean)
        full = at.kinds.count(GroupKind.FULL) / len(at.kinds)
        zero = at.kinds.count(GroupKind.ZERO) / len(at.kinds)
        if self.level > 0 and zero >= s.fall_share:
            self.falls_from[self.level] = self.falls_from.get(self.level, 0) + 1
            return self._move(self.level - 1, LevelMove.FALL, f"{zero:.0%} of the last {len(at.kinds)} groups at "
                              "zero reward")
        if self.level > 0 and s.collapse > 0 and best > 0 and mean < s.collapse * best:
            self.falls_from[self.level] = self.falls_from.get(self.level, 0) + 1
            return self._move(self.level - 1, LevelMove.FALL, f"the reward collapsed: window mean {mean:.3f}, "
                              f"below {s.collapse:g} x its best {best:.3f}")
        solved = solved_share is not None and solved_share >= s.rise_share
        if self.level < self.top and at.groups >= self.groups_to_rise() and (full >= s.rise_share or solved):
            why = (f"{full:.0%} of the last {len(at.kinds)} groups at full reward" if full >= s.rise_share
                   else f"{solved_share:.0%} of its tasks retired as solved")
            return self._move(self.level + 1, LevelMove.RISE, why)
        return None

    def _move(self, new: int, move: LevelMove, reason: str) -> LevelChange:
        change = LevelChange(task_type=self.task_type, old=self.level, new=new, move=move, reason=reason,
                             groups=self._at.groups)
        self.history.append(change)
        self.level = new
        self._at = self._fresh()
        return change
