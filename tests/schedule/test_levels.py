"""Difficulty levels (``agentjet.schedule.levels``, ``agentjet.schedule.levelled``): the rule that moves a task type
up and down its levels by its group results, and the draws across levels with retirement within each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from agentjet.schedule import CurriculumSettings, LevelledTasks, LevelMove, LevelRule, LevelSettings

FULL, ZERO, MIXED = [1.0] * 4, [0.0] * 4, [1.0, 0.0, 1.0, 0.0]
SETTINGS = LevelSettings(window=4, rise_share=0.75, fall_share=0.75, collapse=0.5, probe=2, backoff=2.0)


def done_probing(rule: LevelRule) -> LevelRule:
    """A rule past its probe (one group with a signal at its start level)."""
    assert rule.record(rule.level, MIXED) is None
    return rule


def test_a_level_rises_after_a_run_of_uniform_full_reward_groups() -> None:
    rule = done_probing(LevelRule(top=3, settings=SETTINGS))
    moves = [rule.record(0, FULL) for _ in range(3)]  # the window holds MIXED + 3 x FULL: 75 % full
    assert moves[:2] == [None, None] and moves[2] is not None
    assert (moves[2].old, moves[2].new, moves[2].move) == (0, 1, LevelMove.RISE) and rule.level == 1
    assert moves[2].groups == 4 and "75% of the last 4 groups at full reward" in moves[2].reason
    # a fresh window at the new level: three full groups are not enough yet
    assert [rule.record(1, FULL) for _ in range(3)] == [None] * 3 and rule.level == 1


def test_mixed_groups_hold_the_level() -> None:
    rule = done_probing(LevelRule(top=3, settings=SETTINGS))
    assert [rule.record(0, r) for r in (FULL, MIXED, FULL, MIXED, FULL, [0.5] * 4) * 3] == [None] * 18
    assert rule.level == 0 and not rule.history


def test_a_level_falls_after_a_collapse_of_the_reward() -> None:
    rule = LevelRule(top=3, start=2, settings=SETTINGS)
    for _ in range(4):
        rule.record(2, [1.0, 1.0, 0.0, 1.0])  # mixed: the probe ends at once; the best window mean is 0.75
    assert rule.level == 2 and rule.probe.value == "done"
    for _ in range(3):
        assert rule.record(2, [1.0, 0.0, 0.0, 0.0]) is None  # the window mean falls: 0.625, 0.5, ...
    change = rule.record(2, [1.0, 0.0, 0.0, 0.0])  # a window of 0.25 each: below 0.5 x 0.75
    assert change is not None and (change.old, change.new, change.move) == (2, 1, LevelMove.FALL)
    assert "collapsed" in change.reason and rule.level == 1


def test_a_level_falls_when_its_groups_are_mostly_uniform_at_zero_and_never_below_0() -> None:
    rule = done_probing(LevelRule(top=2, start=1, settings=SETTINGS))
    for _ in range(2):
        assert rule.record(1, ZERO) is None
    change = rule.record(1, ZERO)
    assert change is not None and change.move is LevelMove.FALL and rule.level == 0
    assert [rule.record(0, ZERO) for _ in range(12)] == [None] * 12 and rule.level == 0  # 0 is the floor


def test_a_level_never_passes_its_top() -> None:
    rule = done_probing(LevelRule(top=1, settings=SETTINGS))
    for _ in range(4):
        rule.record(0, FULL)
    assert rule.level == 1
    assert [rule.record(1, FULL) for _ in range(40)] == [None] * 40
    assert rule.level == 1 == rule.highest
    with pytest.raises(ValueError):
        LevelRule(top=1, start=2)


def test_the_probe_starts_where_groups_give_signal() -> None:
    up = LevelRule(top=4, settings=SETTINGS)
    moves = [up.record(up.level, FULL) for _ in range(4)] + [up.record(up.level, MIXED)]
    assert [m.move for m in moves if m] == [LevelMove.PROBE_UP] * 2 and up.level == 2  # 2 full groups a level
    assert up.probe.value == "done" and up.record(2, FULL) is None  # the window rule from here on
    down = LevelRule(top=4, start=3, settings=SETTINGS)
    for _ in range(2):
        down.record(3, ZERO)
    assert down.level == 2 and down.history[-1].move is LevelMove.PROBE_DOWN
    for _ in range(2):
        down.record(2, FULL)  # full below zero: no level gives signal; the probe does not turn back
    assert down.level == 2 and down.probe.value == "done"


def test_each_fall_doubles_the_groups_needed_before_the_level_is_tried_again() -> None:
    rule = done_probing(LevelRule(top=2, settings=SETTINGS))
    for _ in range(3):
        rule.record(0, FULL)
    assert rule.level == 1
    for _ in range(4):
        rule.record(1, ZERO)
    assert rule.level == 0 and rule.groups_to_rise() == 8
    assert [rule.record(0, FULL) for _ in range(7)] == [None] * 7 and rule.level == 0
    assert rule.record(0, FULL) is not None and rule.level == 1


def test_groups_of_another_level_are_ignored() -> None:
    rule = done_probing(LevelRule(top=2, settings=SETTINGS))
    assert [rule.record(1, FULL) for _ in range(10)] == [None] * 10 and rule.level == 0


def test_a_level_rises_when_retirement_has_solved_most_of_its_tasks() -> None:
    rule = done_probing(LevelRule(top=2, settings=SETTINGS))
    assert [rule.record(0, MIXED, solved_share=0.5) for _ in range(3)] == [None] * 3
    change = rule.record(0, MIXED, solved_share=0.8)
    assert change is not None and change.move is LevelMove.RISE and "retired as solved" in change.reason


# ---------------------------------------------------------------------------- draws across levels


@dataclass
class Level:
    task_type: str
    level: int
    size: int = 3

    def generate_tasks(self, split: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
        return [{"task_id": f"{self.task_type}-{split}-L{self.level}-{i % self.size}", "task_type": self.task_type}
                for i in range(n)]


@dataclass
class FakeLadder:
    task_type: str
    top: int = 3
    start: int = 0
    named: int | None = 0

    def at(self, level: int) -> Level:
        return Level(self.task_type, level)

    def label(self, level: int) -> str:
        return f"L{level}"


def test_retirement_works_within_a_level_and_the_level_moves_across() -> None:
    heard = []
    tasks = LevelledTasks({"a": FakeLadder("a")}, SETTINGS, pool_n=8, curriculum=CurriculumSettings(revisit=0.0),
                          on_change=heard.append)
    key, task = tasks.draw()
    assert task["level"] == 0 and task["task_id"].startswith("a-train-L0-") and key.startswith("L0:")
    tasks.record(key, MIXED)  # the probe ends
    for _ in range(3):  # the level's three tasks solved, one by one: retired
        key, task = tasks.draw()
        tasks.record(key, FULL)
    assert tasks.levels() == {"a": 1} and heard and heard[-1].new == 1
    key, task = tasks.draw()
    assert task["level"] == 1 and task["task_id"].startswith("a-train-L1-")
    assert tasks.counts()["new"] == 3  # level 1's own retirement, from scratch
    assert tasks.describe()["changes"][0]["move"] == "rise" and tasks.highest() == {"a": 1}


def test_types_take_turns_and_the_eval_is_at_each_types_current_level() -> None:
    tasks = LevelledTasks({"a": FakeLadder("a"), "b": FakeLadder("b", named=None)}, SETTINGS, pool_n=4)
    assert [tasks.draw()[1]["task_type"] for _ in range(4)] == ["a", "b", "a", "b"]
    evals = tasks.eval_tasks(2)  # a is at its named level (the run's own eval scores it); b is named by no level
    assert [(t["task_type"], t["level"], t["index"]) for t in evals] == [("b", 0, 0), ("b", 0, 1)]
    assert all(t["task_id"].startswith("b-eval-L0-") for t in evals)
    assert not tasks.exhausted
