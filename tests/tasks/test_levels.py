"""Each task source's difficulty levels (``ladders()``): addition's digits, reasoning-gym's curricula, GuessTheNumber's
range and turns; the levelled source that scores a task by its level's source; and a task source without levels,
which keeps today's behaviour."""

from __future__ import annotations

import importlib.util
import re

import pytest
from typer.testing import CliRunner

from agentjet.tasks import LevelledSource, addition, calculator, get_task, ladders, lookup, toy

NEEDS_RG = pytest.mark.skipif(importlib.util.find_spec("reasoning_gym") is None, reason="reasoning-gym is not installed")
NEEDS_TA = pytest.mark.skipif(importlib.util.find_spec("textarena") is None, reason="textarena is not installed")


def operands(task: dict) -> tuple[int, int]:
    a, b = map(int, re.findall(r"\d+", task["messages"][0]["content"]))
    return a, b


def test_addition_level_0_is_todays_task_and_higher_levels_add_digits() -> None:
    (ladder,) = ladders(addition).values()
    assert (ladder.task_type, ladder.top, ladder.start, ladder.named) == ("addition", 4, 0, 0)
    assert ladder.at(0) is addition  # unchanged: earlier results stay comparable
    for split in ("train", "eval"):
        assert ladder.at(0).generate_tasks(split, 50, seed=3) == addition.generate_tasks(split, 50, seed=3)
    digits = {1: {(2, 1), (1, 2)}, 2: {(2, 2)}, 3: {(3, 2), (2, 3)}, 4: {(3, 3)}}
    for level, want in digits.items():
        source = ladder.at(level)
        train, held = source.generate_tasks("train", 400), source.generate_tasks("eval", 44)
        assert {(len(str(a)), len(str(b))) for a, b in map(operands, train + held)} <= want
        assert all(t["task_type"] == "addition" and t["answer"] == str(sum(operands(t))) for t in train + held)
        assert len({t["task_id"] for t in held}) == 44  # distinct held-out pairs
        assert not {t["task_id"] for t in train} & {t["task_id"] for t in held}
        assert all(addition.in_eval_split(*operands(t)) for t in held)  # the one hash split, at every level
        assert source.generate_tasks("eval", 44) == held  # deterministic
        assert source.reward(held[0], f"= {held[0]['answer']}") == 1.0 and source.reward(held[0], "0") == 0.0
    with pytest.raises(ValueError):
        ladder.at(5)


def test_a_task_source_without_levels_keeps_todays_behaviour() -> None:
    for source in (calculator, lookup, toy):
        assert ladders(source) == {}
    assert LevelledSource(addition, ladders(addition)).source_of(addition.generate_tasks("eval", 1)[0]) is addition
    runner = CliRunner()
    from agentjet.cli import app

    out = runner.invoke(app, ["demo", "--task", "calculator", "--levels"])
    assert out.exit_code != 0 and "has no difficulty levels" in out.output


@NEEDS_RG
def test_reasoning_gym_levels_are_its_curriculum_and_the_named_task_is_one_of_them_when_equal() -> None:
    knobs = get_task("rg:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1")
    ladder = ladders(knobs)["chain_sum"]
    assert (ladder.top, ladder.start, ladder.named) == (10, 0, 0)  # these knobs are curriculum level 0
    assert ladder.label(1) == "level=1: max_digits=2,max_terms=3,min_digits=1,min_terms=2"
    held = set(knobs.datasets["chain_sum"].splits["eval"])
    one = ladder.at(1)
    assert one.NAME == "rg:chain_sum:level=1" and one.datasets["chain_sum"].spec.knobs == {"level": 1}
    inside = held & set(one.datasets["chain_sum"].entries)
    assert inside and not inside & set(one.datasets["chain_sum"].splits["train"])  # never trained on a level
    assert all(t["task_type"] == "chain_sum" for t in one.generate_tasks("train", 20))

    gcd = ladders(get_task("rg:gcd"))["gcd"]  # its defaults equal no level: training starts at 0
    assert (gcd.top, gcd.start, gcd.named) == (3, 0, None)
    counting = ladders(get_task("rg:letter_counting"))["letter_counting"]  # defaults 5..15 words: level 4
    assert (counting.start, counting.named) == (4, 4)
    assert ladders(get_task("rg:chain_sum:level=3"))["chain_sum"].named == 3


@NEEDS_RG
def test_a_mixture_keeps_a_dataset_without_a_curriculum_at_one_level() -> None:
    mix = ladders(get_task("rg:chain_sum:level=0+acre"))
    assert (mix["chain_sum"].top, mix["acre"].top, mix["acre"].named) == (10, 0, 0)
    assert {t["task_type"] for t in mix["acre"].at(0).generate_tasks("eval", 4)} == {"acre"}
    assert ladders(get_task("rg:acre")) == {}  # no curriculum at all: no levels


@NEEDS_TA
def test_guess_the_number_levels_are_its_range_and_turns() -> None:
    named = get_task("ta:GuessTheNumber-v0:reward=win")
    ladder = ladders(named)["GuessTheNumber-v0"]
    assert (ladder.top, ladder.start, ladder.named) == (4, 2, 2)  # 1..20 in 10 turns, as registered
    easy = ladder.at(0)
    assert easy.spec.knobs == {"min_number": 1, "max_number": 5, "max_turns": 5} and easy.spec.reward.value == "win"
    task = {**easy.generate_tasks("eval", 1)[0], "level": 0}
    assert LevelledSource(named, {"GuessTheNumber-v0": ladder}).source_of(task) is easy  # scored by its level
    assert ladders(get_task("ta:TowerOfHanoi-v0")) == {}
    assert ladders(get_task("ta:GuessTheNumber-v0:max_number=7"))["GuessTheNumber-v0"].named is None
