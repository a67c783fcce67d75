"""A training client that spends its rollouts where they teach: a curriculum picks each group's task, a
held-out eval runs at fixed intervals of the training clock, and a stopping rule ends the run on a plateau.

    run = await run_scheduled(client, workflow, eval_workflow, pool, eval_tasks, RunSettings(...))

- **curriculum** (``agentjet.schedule.Curriculum``): each group's task is drawn from ``pool`` by its
  recent group results (solved tasks retired, see there); without it the pool is cycled in order;
- **difficulty levels** (``levels``, an ``agentjet.schedule.LevelledTasks``; instead of ``pool`` and
  ``curriculum``): each group's task is drawn at its task type's current level, retirement works within the
  level and the level rule moves across; each eval scores the ``eval_tasks`` (the task as named, the fixed
  starting point) and each type's held-out tasks at its current level (``EvalPoint.levels``,
  ``EvalPoint.level_rewards``). Every episode of a task with a level is noted with it (``Episode.note``), so the
  server's store, and the dashboard's eval curves, have it;
- **periodic eval**: every ``eval_every_s`` of training time (the clock stops during evals), or at the
  training times ``eval_at_s``, training pauses and the ``eval_tasks`` run as eval episodes (never trained on).
  Eval points are at the start, at each interval inside the time budget and at the end;
- **stopping**: ``max_steps`` train steps, ``time_budget_s``, or ``agentjet.schedule.StoppingRule``
  (eval plateau; uniform groups; curriculum exhausted);
- **the settings** are one :class:`agentjet.client.settings.RunSettings`, the driver's (a group size of none is
  the server's);
- **the best checkpoint** (``keep_best``): after each eval the server pins the step's checkpoint as the run's
  best if the eval beats the pinned one, so a run that slides after its peak still ends with its peak on disk.

The pauses, the training clock and the stop conditions are the driver's (``agentjet.client.driver``); this
module adds the curriculum and the group bookkeeping. Pausing training uses the control API
(``/swarm/v1/control/pause``): give the client the admin token when the server has one.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from agentjet.client.client import Episode, SwarmClient
from agentjet.client.driver import Driver, DriverRun, EvalPoint, EvalScores, Evaluate, StepPoint, held_out
from agentjet.client.runner import Workflow, run_workflow
from agentjet.client.settings import RunSettings
from agentjet.protocol import Reward, ServerStatus, reward_mean
from agentjet.runtime.clock import Clock
from agentjet.schedule import Curriculum, LevelledTasks, StoppingRule

__all__ = ["EvalPoint", "RunSettings", "ScheduledRun", "StepPoint", "run_scheduled"]


@dataclass
class ScheduledRun(DriverRun):
    train_reward_by_version: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    groups: int = 0
    uniform_groups: int = 0
    curriculum: dict[str, int] = field(default_factory=dict)
    levels: dict[str, Any] = field(default_factory=dict)  # with levels: the ladders, the moves, where each type ended


class _Groups:
    """Collects the rewards of each drawn group's episodes; calls ``on_group`` when a group is complete."""

    def __init__(self, group_size: int, on_group: Callable[[str, list[float]], None]) -> None:
        self.group_size = group_size
        self.on_group = on_group
        self._got: dict[str, list[float | None]] = defaultdict(list)
        self._key: dict[str, str] = {}

    def open(self, dispatch: str, key: str) -> None:
        self._key[dispatch] = key

    def add(self, dispatch: str, reward: float | None) -> None:
        got = self._got[dispatch]
        got.append(reward)
        if len(got) == self.group_size:
            del self._got[dispatch]
            key = self._key.pop(dispatch)
            self.on_group(key, [r for r in got if r is not None])


class _Draws(Protocol):
    """Where each group's task comes from: a pool (``_PoolDraws``) or the difficulty levels (``LevelledTasks``)."""

    def draw(self) -> tuple[str, dict[str, Any]]: ...

    def record(self, key: str, rewards: list[float]) -> object: ...

    def release(self, key: str) -> None: ...

    @property
    def exhausted(self) -> bool: ...


class _PoolDraws:
    """A pool's tasks, drawn by the curriculum (solved ones retired) or cycled in order."""

    def __init__(self, pool: list[dict[str, Any]], curriculum: Curriculum | None) -> None:
        self.by_key = {str(t["task_id"]): t for t in pool}
        self.curriculum = curriculum
        self._keys = list(self.by_key)
        self._n = 0

    def draw(self) -> tuple[str, dict[str, Any]]:
        if self.curriculum is not None:
            key = self.curriculum.draw()
        else:
            key = self._keys[self._n % len(self._keys)]
            self._n += 1
        return key, self.by_key[key]

    def record(self, key: str, rewards: list[float]) -> None:
        if self.curriculum is not None:
            self.curriculum.record(key, rewards)

    def release(self, key: str) -> None:
        if self.curriculum is not None:
            self.curriculum.release(key)

    @property
    def exhausted(self) -> bool:
        return self.curriculum is not None and self.curriculum.exhausted


@dataclass
class _Stopping:
    """The stopping rule, told whether the draws have retired every task."""

    rule: StoppingRule
    draws: _Draws

    def observe_eval(self, value: float) -> None:
        self.rule.observe_eval(value)

    def check(self) -> str | None:
        return self.rule.check(self.draws.exhausted)


def _noted(workflow: Workflow) -> Workflow:
    """``workflow``, with each episode of a task at a difficulty level noted with it (the server keeps it)."""
    async def noted(task: dict[str, Any], ep: Episode) -> Reward:
        if "level" in task:
            ep.note(level=task["level"])
        return await workflow(task, ep)

    return noted


class _Rollouts:
    """The training side of a scheduled run: draws each group's task and feeds each finished group's rewards to
    the draws (retirement, levels), the stopping rule and the run's counters."""

    def __init__(self, draws: _Draws, group_size: int, run: ScheduledRun, stopping: StoppingRule | None) -> None:
        self.draws, self.run, self.stopping = draws, run, stopping
        self.groups = _Groups(group_size, self.on_group)

    def on_group(self, key: str, rewards: list[float]) -> None:
        self.run.groups += 1
        if not rewards:
            self.draws.release(key)
            return
        self.run.uniform_groups += len(set(rewards)) <= 1
        self.draws.record(key, rewards)
        if self.stopping is not None:
            self.stopping.observe_group(rewards)

    def tasks(self) -> Iterator[dict[str, Any]]:
        n = 0
        while True:
            key, task = self.draws.draw()
            dispatch = f"{key}-d{n}"
            self.groups.open(dispatch, key)
            n += 1
            yield {**task, "task_id": dispatch, "_dispatch": dispatch}

    def workflow(self, workflow: Workflow) -> Workflow:
        async def train_workflow(task: dict[str, Any], ep: Episode) -> Reward:
            reward = None
            try:
                reward = await workflow(task, ep)
                if ep.policy_version is not None and reward is not None:
                    self.run.train_reward_by_version[ep.policy_version].append(reward_mean(reward))
                return reward
            finally:
                self.groups.add(task["_dispatch"], None if reward is None else reward_mean(reward))

        return _noted(train_workflow)


def levelled_eval(client: SwarmClient, workflow: Workflow, eval_tasks: list[dict[str, Any]], levels: LevelledTasks,
                  concurrency: int, n_per_type: int) -> Evaluate:
    """An evaluation with difficulty levels: ``eval_tasks`` (the task as named; its tasks noted with their type's
    level when the named task is one) and, beside them, ``n_per_type`` held-out tasks of each type at its current
    level; the level's reward per type (the named tasks' when a type is at its named level)."""

    def at_named(task: dict[str, Any]) -> dict[str, Any]:
        ladder = levels.ladders.get(str(task.get("task_type")))
        return {**task, "level": ladder.named} if ladder is not None and ladder.named is not None else task

    named = [at_named(t) for t in eval_tasks]

    async def evaluate() -> EvalScores:
        now = levels.levels()
        got: dict[tuple[str, int | None], list[float]] = defaultdict(list)

        async def scored(task: dict[str, Any], ep: Episode) -> Reward:
            reward = await workflow(task, ep)
            got[(str(task.get("task_type")), task.get("level"))].append(reward_mean(reward))
            return reward

        at_level = levels.eval_tasks(n_per_type)
        start, _ = await asyncio.gather(
            run_workflow(client, _noted(scored), named, group_size=1, concurrency=concurrency, eval=True),
            run_workflow(client, _noted(scored), at_level, group_size=1, concurrency=concurrency, eval=True))
        rewards = {t: sum(r) / len(r) for t, level in now.items() if (r := got.get((t, level)))}
        return EvalScores(start, levels=now, level_rewards=rewards)

    return evaluate


async def run_scheduled(
    client: SwarmClient,
    workflow: Workflow,
    eval_workflow: Workflow,
    pool: list[dict[str, Any]],
    eval_tasks: list[dict[str, Any]],
    settings: RunSettings,
    *,
    curriculum: Curriculum | None = None,
    levels: LevelledTasks | None = None,
    level_eval_n: int | None = None,
    stopping: StoppingRule | None = None,
    at_pause: Callable[[float], Awaitable[None]] | None = None,
    on_step: Callable[[StepPoint], None] | None = None,
    on_eval: Callable[[EvalPoint], None] | None = None,
    on_quiet: Callable[[ServerStatus], None] | None = None,
    clock: Clock | None = None,
) -> ScheduledRun:
    """Train through ``client`` until a stop condition; see the module docstring. ``at_pause(train_seconds)``
    runs at every pause during training (training paused), before its eval (a benchmark saves a checkpoint
    there). With no ``eval_tasks`` the pauses run no eval. With ``levels`` the training tasks are the levels' and
    ``pool`` is not drawn from; ``level_eval_n``: held-out tasks per type at its level (default: the
    ``eval_tasks``' share of each type)."""
    if levels is not None and curriculum is not None:
        raise ValueError("with levels, retirement is the levels' own (LevelledTasks(curriculum=...)): give no "
                         "curriculum")
    if not pool and levels is None:
        raise ValueError("the task pool is empty")
    run = ScheduledRun()
    settings = settings.model_copy(update={"group_size": client.group_size(settings.group_size)})
    assert settings.group_size is not None
    draws: _Draws = levels if levels is not None else _PoolDraws(pool, curriculum)
    side = _Rollouts(draws, settings.group_size, run, stopping)
    evaluate: Evaluate | None = None
    if eval_tasks and levels is not None:
        n = level_eval_n or max(len(eval_tasks) // len(levels.ladders), 1)
        evaluate = levelled_eval(client, eval_workflow, eval_tasks, levels, settings.concurrency, n)
    elif eval_tasks:
        evaluate = held_out(client, eval_workflow, eval_tasks, settings.concurrency)
    driver = Driver(client, side.workflow(workflow), settings, evaluate=evaluate,
                    clock=clock, at_pause=at_pause, on_eval=on_eval, on_step=on_step, on_quiet=on_quiet)
    done = await driver.run(side.tasks(), _Stopping(stopping, draws) if stopping is not None else None)
    for f in fields(DriverRun):
        setattr(run, f.name, getattr(done, f.name))
    if curriculum is not None:
        run.curriculum = curriculum.counts()
    if levels is not None:
        run.curriculum = levels.counts()
        run.levels = levels.describe()
    return run
