"""A scheduled run with difficulty levels (``run_scheduled(levels=...)``) on the in-memory server and a fake clock:
the level follows a model that gets better with each train step, never passes its top, and every eval is scored
at the task as named and at the level being trained. Without levels a run is as it was."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.client.test_driver import FakeEpisode, FakeServer
from tests.schedule.test_levels import FakeLadder

from agentjet.client.scheduled import run_scheduled
from agentjet.client.settings import RunSettings
from agentjet.runtime.clock import FakeClock
from agentjet.schedule import CurriculumSettings, LevelledTasks, LevelSettings

NAMED_EVAL = [{"task_id": f"a-eval-named-{i}", "task_type": "a", "index": i} for i in range(4)]


class NotedEpisode(FakeEpisode):
    def note(self, **metadata: Any) -> None:
        self.server.notes.append((self.task_id, self.eval, metadata))  # type: ignore[attr-defined]


class LearningServer(FakeServer):
    """The in-memory server, and a model whose skill is one level per ``per_level`` training episodes: below its
    skill a group is all right, at it half right, above it all wrong."""

    def __init__(self, per_level: int = 24) -> None:
        super().__init__()
        self.per_level = per_level
        self.notes: list[tuple[str, bool, dict[str, Any]]] = []
        self.evaluated: list[tuple[int, int | None]] = []  # (train steps, level of the task)
        self.seen: dict[str, int] = {}  # episodes begun per group (dispatch id)
        self.trained = 0

    def episode(self, task_id: str, task_type: str = "default", group_id: str | None = None, eval: bool = False,
                metadata: dict[str, Any] | None = None) -> FakeEpisode:
        return NotedEpisode(self, task_id, eval)

    def skill(self) -> int:
        return self.trained // self.per_level

    async def train(self, task: dict[str, Any], ep: Any) -> float:
        level, skill = task["level"], self.skill()
        self.trained += 1
        nth = self.seen[task["task_id"]] = self.seen.get(task["task_id"], 0) + 1  # a group: its 1st right, 2nd wrong
        return 1.0 if level < skill else float(nth % 2) if level == skill else 0.0

    async def evaluate(self, task: dict[str, Any], ep: Any) -> float:
        level = task["level"]  # the named tasks too: the task as named is level 0
        self.evaluated.append((self.train_steps, level))
        return 1.0 if level < self.skill() else 0.5 if level == self.skill() else 0.0


def run_with_levels(server: LearningServer, top: int = 3, **run: Any) -> Any:
    levels = LevelledTasks({"a": FakeLadder("a", top=top)}, LevelSettings(window=4, probe=2), pool_n=8,
                           curriculum=CurriculumSettings())
    settings = RunSettings(group_size=2, concurrency=4, poll_s=1.0, time_budget_s=None, **run)
    return asyncio.run(run_scheduled(server, server.train, server.evaluate, [], NAMED_EVAL, settings,  # type: ignore[arg-type]
                                     levels=levels, level_eval_n=3, clock=FakeClock())), levels


def test_the_level_rises_with_the_model_and_never_passes_its_top() -> None:
    server = LearningServer()
    run, levels = run_with_levels(server, max_steps=160, eval_every_steps=20)
    moves = run.levels["changes"]
    assert [m["move"] for m in moves].count("rise") >= 2
    assert all(m["new"] == m["old"] + 1 for m in moves if m["move"] == "rise")
    assert levels.levels() == {"a": 3} == levels.highest()  # the top, reached and never passed
    assert all(m["new"] <= 3 for m in moves) and run.levels["ladders"]["a"]["top"] == 3
    # each training episode was noted with its task's level, so the server keeps it
    train_notes = [meta["level"] for _, is_eval, meta in server.notes if not is_eval]
    assert train_notes and set(train_notes) >= {0, 3}


def test_every_eval_is_scored_at_the_task_as_named_and_at_the_level_trained() -> None:
    server = LearningServer()
    run, _ = run_with_levels(server, max_steps=160, eval_every_steps=20)
    assert len(run.evals) >= 4
    levels_seen = {e.levels["a"] for e in run.evals}
    assert len(levels_seen) >= 2  # evals at two levels (at least) were recorded
    for e in run.evals:
        assert set(e.levels) == set(e.level_rewards) == {"a"} and e.episodes == len(NAMED_EVAL)
    # the named tasks (the fixed starting point, level 0): half right before the model learns, then all right
    assert run.evals[0].reward == 0.5 and run.evals[-1].reward == 1.0
    later = [e for e in run.evals if e.levels["a"] > 0]
    assert later and all(e.level_rewards["a"] in (0.0, 0.5, 1.0) for e in later)
    assert any(e.level_rewards["a"] < e.reward for e in later)  # the level trained not yet solved, the start is
    # in one pause, both the named tasks and the level's (3 a type) ran: the named ones noted with level 0
    by_step: dict[int, list[int | None]] = {}
    for step, level in server.evaluated:
        by_step.setdefault(step, []).append(level)
    mixed = [lv for lv in by_step.values() if any(x not in (None, 0) for x in lv)]
    assert mixed and all(lv.count(0) == len(NAMED_EVAL) and len(lv) == len(NAMED_EVAL) + 3 for lv in mixed)
    eval_notes = [meta["level"] for _, is_eval, meta in server.notes if is_eval]
    assert eval_notes.count(0) >= len(NAMED_EVAL) * len(run.evals)


def test_at_the_named_level_the_level_reward_is_the_named_eval() -> None:
    server = LearningServer(per_level=1000)  # never learns: stays at level 0 (mixed groups there)
    run, levels = run_with_levels(server, max_steps=6, eval_every_steps=3)
    assert levels.levels() == {"a": 0} and not run.levels["changes"]
    assert all(e.levels == {"a": 0} and e.level_rewards == {"a": e.reward} for e in run.evals)
    assert all(level == 0 for _, level in server.evaluated)  # no second eval at the same level
    assert len(server.evaluated) == len(NAMED_EVAL) * len(run.evals)


def test_a_run_without_levels_is_as_it_was() -> None:
    server = FakeServer()
    pool = [{"task_id": f"t{i}"} for i in range(4)]
    settings = RunSettings(group_size=2, concurrency=4, poll_s=1.0, time_budget_s=None, max_steps=6,
                           eval_every_steps=3)
    run = asyncio.run(run_scheduled(server, server.train, server.evaluate, pool, NAMED_EVAL, settings,  # type: ignore[arg-type]
                                    clock=FakeClock()))
    assert run.stop_reason == "steps" and len(run.evals) == 3 and not run.levels  # before, at step 3, the end
    assert all(not e.levels and not e.level_rewards and e.reward == 0.5 for e in run.evals)
