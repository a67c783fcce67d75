from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentjet.settings import LearnerSettings, TrainingSettings
from agentjet.tasks import DEFAULT_TASK, TASKS, Recommended, TaskError, addition, calculator, get_task


def test_registry():
    assert TASKS["addition"] is addition
    assert get_task(DEFAULT_TASK) is addition
    with pytest.raises(TaskError, match="built-in tasks"):
        get_task("nope")


def test_splits_disjoint_and_cover_all_pairs():
    train, ev = set(addition.split_pairs("train")), set(addition.split_pairs("eval"))
    assert not train & ev
    assert len(train | ev) == 100
    assert 15 <= len(ev) <= 40  # roughly a quarter held out
    with pytest.raises(ValueError):
        addition.split_pairs("test")


@pytest.mark.parametrize("split", ["train", "eval"])
def test_generate_tasks_deterministic(split):
    a = addition.generate_tasks(split, 50, seed=3)
    b = addition.generate_tasks(split, 50, seed=3)
    assert a == b
    assert addition.generate_tasks(split, 50, seed=4) != a
    assert len(a) == 50
    assert addition.generate_tasks(split, 0, seed=0) == []


def test_generated_tasks_respect_split_and_schema():
    train_ids = {t["task_id"] for t in addition.generate_tasks("train", 200, seed=0)}
    eval_tasks = addition.generate_tasks("eval", 64, seed=0)
    eval_ids = {t["task_id"] for t in eval_tasks}
    strip = lambda i: i.split("-")[-1]  # noqa: E731 - the pair, without the split prefix
    assert not {strip(i) for i in train_ids} & {strip(i) for i in eval_ids}
    for t in eval_tasks:
        assert t["task_type"] == "addition"
        assert t["answer"] == str(t["a"] + t["b"])
        assert addition.in_eval_split(t["a"], t["b"])
        assert t["messages"][-1]["role"] == "user"
        assert f"{t['a']} + {t['b']}" in t["messages"][-1]["content"]
    # a small n takes distinct items before any repeats
    few = addition.generate_tasks("eval", 10, seed=1)
    assert len({t["task_id"] for t in few}) == 10


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", 1.0),
        (" 8.\n", 1.0),
        ('"8"', 1.0),
        ("**8**", 1.0),
        ("The answer is 8.", 1.0),
        ("3 + 5 = 8", 1.0),
        ("3 + 5 equals 8!", 1.0),
        ("8 apples. No wait, 9", 0.0),
        ("9", 0.0),
        ("8 is close, but it is 9", 0.0),
        ("88", 0.0),
        ("-8", 0.0),
        ("", 0.0),
        ("I don't know", 0.0),
        ("eight", 0.0),
    ],
)
def test_reward(text, expected):
    task = addition.make_task(3, 5)
    assert addition.reward(task, text) == expected


def test_reward_zero_sum_and_two_digit_sums():
    task = addition.make_task(0, 0)
    assert addition.reward(task, "0") == 1.0
    assert addition.reward(task, "0 + 0 = 0") == 1.0
    assert addition.reward(task, "10") == 0.0
    task = addition.make_task(9, 9)
    assert addition.reward(task, "9 + 9 = 18") == 1.0
    assert addition.reward(task, "9 + 9 = 1 8") == 0.0
    for text in ("", "18", "x" * 1000):
        assert 0.0 <= addition.reward(task, text) <= 1.0


def test_constants():
    for d in (addition.SAMPLING, addition.EVAL_SAMPLING):
        assert 0 < d["temperature"] <= 1.0
        assert d["max_tokens"] >= 8
    assert "seed" in addition.EVAL_SAMPLING
    names = set(TrainingSettings.model_fields)
    assert set(addition.RECOMMENDED.training()) <= names  # the training values are named as the settings are
    assert set(calculator.RECOMMENDED.training()) <= names
    assert set(addition.RECOMMENDED.learner()) <= set(LearnerSettings.model_fields)
    with pytest.raises(ValidationError, match="groups_per_batch"):
        Recommended.model_validate({**addition.RECOMMENDED.model_dump(), "groups_per_batch": 4})
