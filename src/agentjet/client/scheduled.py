"""A training client that spends its rollouts where they teach: a curriculum picks each group's task, a
held-out eval runs at fixed intervals of the training clock, and a stopping rule ends the run on a plateau.

    run = await run_scheduled(client, workflow, eval_workflow, pool, eval_tasks, RunSettings(...))

- **curriculum** (``agentjet.schedule.Curriculum``): each group's task is drawn from ``pool`` by its
  recent group results (solved tasks retired, see there); without it the pool is cycled in order;
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

from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from agentjet.client.client import Episode, SwarmClient
from agentjet.client.driver import Driver, DriverRun, EvalPoint, StepPoint, held_out
from agentjet.client.runner import Workflow
from agentjet.client.settings import RunSettings
from agentjet.protocol import Reward, ServerStatus, reward_mean
from agentjet.runtime.clock import Clock
from agentjet.schedule import Curriculum, StoppingRule

__all__ = ["EvalPoint", "RunSettings", "ScheduledRun", "StepPoint", "run_scheduled"]


@dataclass
class ScheduledRun(DriverRun):
    train_reward_by_version: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    groups: int = 0
    uniform_groups: int = 0
    curriculum: dict[str, int] = field(default_factory=dict)


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


@dataclass
class _Stopping:
    """The stopping rule, told whether the curriculum has retired every task."""

    rule: StoppingRule
    curriculum: Curriculum | None

    def observe_eval(self, value: float) -> None:
        self.rule.observe_eval(value)

    def check(self) -> str | None:
        return self.rule.check(self.curriculum is not None and self.curriculum.exhausted)


class _Rollouts:
    """The training side of a scheduled run: draws each group's task (curriculum or cycling the pool) and
    feeds each finished group's rewards to the curriculum, the stopping rule and the run's counters."""

    def __init__(self, pool: list[dict[str, Any]], group_size: int, run: ScheduledRun,
                 curriculum: Curriculum | None, stopping: StoppingRule | None) -> None:
        self.by_key = {str(t["task_id"]): t for t in pool}
        self.run, self.curriculum, self.stopping = run, curriculum, stopping
        self.groups = _Groups(group_size, self.on_group)

    def on_group(self, key: str, rewards: list[float]) -> None:
        self.run.groups += 1
        if not rewards:
            if self.curriculum is not None:
                self.curriculum.release(key)
            return
        self.run.uniform_groups += len(set(rewards)) <= 1
        if self.curriculum is not None:
            self.curriculum.record(key, rewards)
        if self.stopping is not None:
            self.stopping.observe_group(rewards)

    def tasks(self) -> Iterator[dict[str, Any]]:
        keys = list(self.by_key)
        n = 0
        while True:
            key = self.curriculum.draw() if self.curriculum is not None else keys[n % len(keys)]
            dispatch = f"{key}-d{n}"
            self.groups.open(dispatch, key)
            n += 1
            yield {**self.by_key[key], "task_id": dispatch, "_dispatch": dispatch}

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

        return train_workflow


async def run_scheduled(
    client: SwarmClient,
    workflow: Workflow,
    eval_workflow: Workflow,
    pool: list[dict[str, Any]],
    eval_tasks: list[dict[str, Any]],
    settings: RunSettings,
    *,
    curriculum: Curriculum | None = None,
    stopping: StoppingRule | None = None,
    at_pause: Callable[[float], Awaitable[None]] | None = None,
    on_step: Callable[[StepPoint], None] | None = None,
    on_eval: Callable[[EvalPoint], None] | None = None,
    on_quiet: Callable[[ServerStatus], None] | None = None,
    clock: Clock | None = None,
) -> ScheduledRun:
    """Train through ``client`` until a stop condition; see the module docstring. ``at_pause(train_seconds)``
    runs at every pause during training (training paused), before its eval (a benchmark saves a checkpoint
    there). With no ``eval_tasks`` the pauses run no eval."""
    if not pool:
        raise ValueError("the task pool is empty")
    run = ScheduledRun()
    settings = settings.model_copy(update={"group_size": client.group_size(settings.group_size)})
    assert settings.group_size is not None
    side = _Rollouts(pool, settings.group_size, run, curriculum, stopping)
    driver = Driver(client, side.workflow(workflow), settings,
                    evaluate=held_out(client, eval_workflow, eval_tasks, settings.concurrency) if eval_tasks else None,
                    clock=clock, at_pause=at_pause, on_eval=on_eval, on_step=on_step, on_quiet=on_quiet)
    done = await driver.run(side.tasks(), _Stopping(stopping, curriculum) if stopping is not None else None)
    for f in fields(DriverRun):
        setattr(run, f.name, getattr(done, f.name))
    if curriculum is not None:
        run.curriculum = curriculum.counts()
    return run
