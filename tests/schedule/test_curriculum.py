"""The curriculum retires solved tasks, down-weights hopeless ones and says when nothing is left."""

from __future__ import annotations

from collections import Counter

import pytest

from agentjet.schedule import (
    Curriculum,
    CurriculumSettings,
    StoppingRule,
    StopReason,
    StopSettings,
    TaskState,
)


def test_solved_tasks_are_retired_and_the_mix_shifts_to_the_rest() -> None:
    cur = Curriculum(["easy", "hard"], CurriculumSettings(solved_after=2, revisit=0.0), seed=1)
    for _ in range(2):
        cur.draw()
        assert cur.record("easy", [1.0] * 8) in (TaskState.LEARNING, TaskState.SOLVED)
    assert cur.state("easy") is TaskState.SOLVED
    drawn = Counter(cur.draw() for _ in range(50))
    assert drawn == {"hard": 50}  # nothing is wasted on the solved task
    assert not cur.exhausted


def test_a_mixed_group_resets_the_streak() -> None:
    cur = Curriculum(["t"], CurriculumSettings(solved_after=2))
    cur.record("t", [1.0, 1.0])
    cur.record("t", [1.0, 0.0])
    assert cur.state("t") is TaskState.LEARNING
    cur.record("t", [1.0, 1.0])
    assert cur.state("t") is TaskState.LEARNING
    cur.record("t", [1.0, 1.0])
    assert cur.state("t") is TaskState.SOLVED and cur.exhausted


def test_revisits_catch_forgetting() -> None:
    cur = Curriculum(["a", "b"], CurriculumSettings(solved_after=1, revisit=1.0), seed=0)
    cur.record("a", [1.0, 1.0])
    assert cur.draw() == "a"  # revisit probability 1: the solved task comes back
    assert cur.record("a", [0.0, 1.0]) is TaskState.LEARNING


def test_hard_tasks_are_drawn_less() -> None:
    cur = Curriculum(["h", "n"], CurriculumSettings(hard_after=1, hard_weight=0.1), seed=3)
    cur.record("h", [0.0] * 4)
    assert cur.state("h") is TaskState.HARD
    drawn = Counter()
    for _ in range(400):
        k = cur.draw()
        drawn[k] += 1
        cur.release(k)
    assert drawn["n"] > 5 * drawn["h"] > 0


def test_tasks_in_flight_are_drawn_last() -> None:
    cur = Curriculum(["a", "b", "c"], seed=0)
    first = {cur.draw() for _ in range(3)}
    assert first == {"a", "b", "c"}


def test_empty_curriculum_is_an_error() -> None:
    with pytest.raises(ValueError):
        Curriculum([])


def test_stopping_on_eval_plateau() -> None:
    rule = StoppingRule(StopSettings(patience=2, min_delta=0.02, min_evals=3))
    for v in (0.3, 0.6, 0.8):
        rule.observe_eval(v)
        assert rule.check() is None
    rule.observe_eval(0.81)  # not a gain of min_delta
    assert rule.check() is None
    rule.observe_eval(0.79)
    assert rule.check() is StopReason.EVAL_PLATEAU


def test_stopping_when_groups_stop_teaching() -> None:
    rule = StoppingRule(StopSettings(window=10, uniform_share=0.8))
    for i in range(10):
        rule.observe_group([1.0, 1.0] if i < 8 else [0.0, 1.0])
    assert rule.uniform_share == pytest.approx(0.8)
    assert rule.check() is StopReason.NO_SIGNAL
    assert StoppingRule().check(curriculum_exhausted=True) is StopReason.SOLVED


def test_no_stop_before_the_window_fills() -> None:
    rule = StoppingRule(StopSettings(window=10, uniform_share=0.5))
    for _ in range(9):
        rule.observe_group([1.0, 1.0])
    assert rule.check() is None
