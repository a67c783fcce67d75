"""A training client that spends its rollouts where they teach: a curriculum picks each group's task, a
held-out eval runs at fixed intervals of the training clock, and a stopping rule ends the run on a plateau.

    run = await run_scheduled(client, workflow, eval_workflow, pool, eval_tasks, ScheduleSettings(...))

- **curriculum** (``agentjet.schedule.Curriculum``): each group's task is drawn from ``pool`` by its
  recent group results (solved tasks retired, see there); without it the pool is cycled in order;
- **periodic eval**: every ``eval_every_s`` of training time (the clock stops during evals), new training
  calls wait at a gate, training is paused, the ``eval_tasks`` run as eval episodes (never trained on), then
  both resume. Eval points are at the start, at each interval inside the time budget and at the end;
- **stopping**: ``max_steps`` train steps, ``time_budget_s``, or ``agentjet.schedule.StoppingRule``
  (eval plateau; uniform groups; curriculum exhausted).

Pausing training uses the control API (``/swarm/v1/control/pause``): give the client the admin token when
the server has one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agentjet.client.client import Episode, SwarmClient, SwarmError
from agentjet.client.runner import RunSummary, Workflow, run_workflow
from agentjet.protocol import ServerStatus, reward_mean
from agentjet.schedule import Curriculum, StoppingRule

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScheduleSettings:
    group_size: int = 8
    concurrency: int = 32
    max_steps: int | None = None
    time_budget_s: float = 20 * 60  # of training time (wall time less the pauses for evals)
    eval_every_s: float | None = 90.0  # None: evaluate only at the start and the end
    eval_at_s: tuple[float, ...] = ()  # pause points at these training times instead of every eval_every_s
    gate_timeout_s: float = 120.0  # longest wait for in-flight training calls before an eval
    poll_s: float = 1.0


@dataclass
class EvalPoint:
    seconds: float  # wall time since the run started (evals included)
    train_seconds: float  # training time: wall time less the pauses for evals
    train_steps: int
    policy_version: int
    reward: float
    episodes: int
    eval_seconds: float


@dataclass
class StepPoint:
    seconds: float
    train_steps: int
    policy_version: int
    metrics: dict[str, float]


@dataclass
class ScheduledRun:
    evals: list[EvalPoint] = field(default_factory=list)
    steps: list[StepPoint] = field(default_factory=list)
    train: RunSummary = field(default_factory=RunSummary)
    train_reward_by_version: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    stop_reason: str = ""
    train_seconds: float = 0.0
    groups: int = 0
    uniform_groups: int = 0
    seconds: float = 0.0
    curriculum: dict[str, int] = field(default_factory=dict)

    @property
    def merge_ratio(self) -> float:
        """Chat calls per training sample in the finished training episodes (1.0: nothing merged)."""
        return self.train.merge_ratio


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


async def _control(client: SwarmClient, action: str) -> None:
    """Pause (waiting for a step in progress) or resume training; a refusal is logged, not raised."""
    try:
        if action == "pause":
            await client.pause(wait_for_step=True)
        else:
            await client.resume()
    except SwarmError as exc:
        log.warning("could not %s training (%s): periodic evals may overlap train steps", action, exc)


async def run_scheduled(
    client: SwarmClient,
    workflow: Workflow,
    eval_workflow: Workflow,
    pool: list[dict[str, Any]],
    eval_tasks: list[dict[str, Any]],
    settings: ScheduleSettings,
    *,
    curriculum: Curriculum | None = None,
    stopping: StoppingRule | None = None,
    at_pause: Callable[[float], Awaitable[None]] | None = None,
    on_step: Callable[[StepPoint], None] | None = None,
    on_eval: Callable[[EvalPoint], None] | None = None,
    on_quiet: Callable[[ServerStatus], None] | None = None,
) -> ScheduledRun:
    """Train through ``client`` until a stop condition; see the module docstring. ``at_pause(train_seconds)``
    runs at every pause during training (training paused), before its eval (a benchmark saves a checkpoint there). With no ``eval_tasks``
    the pauses run no eval."""
    if not pool:
        raise ValueError("the task pool is empty")
    by_key = {str(t["task_id"]): t for t in pool}
    run = ScheduledRun()
    start = time.monotonic()
    paused_s = 0.0  # time spent in eval pauses

    def train_clock() -> float:
        return time.monotonic() - start - paused_s

    done = asyncio.Event()
    gate = asyncio.Event()
    gate.set()
    active = 0  # training workflows past the gate

    def on_group(key: str, rewards: list[float]) -> None:
        run.groups += 1
        if not rewards:
            if curriculum is not None:
                curriculum.release(key)
            return
        run.uniform_groups += len(set(rewards)) <= 1
        if curriculum is not None:
            curriculum.record(key, rewards)
        if stopping is not None:
            stopping.observe_group(rewards)

    groups = _Groups(settings.group_size, on_group)

    async def train_workflow(task: dict[str, Any], ep: Episode) -> Any:
        nonlocal active
        reward = None
        try:
            await gate.wait()
            active += 1
            try:
                reward = await workflow(task, ep)
            finally:
                active -= 1
            if ep.policy_version is not None and reward is not None:
                run.train_reward_by_version[ep.policy_version].append(reward_mean(reward))
            return reward
        finally:
            groups.add(task["_dispatch"], None if reward is None else reward_mean(reward))

    def tasks() -> Iterator[dict[str, Any]]:
        n = 0
        keys = list(by_key)
        while not done.is_set():
            key = curriculum.draw() if curriculum is not None else keys[n % len(keys)]
            dispatch = f"{key}-d{n}"
            groups.open(dispatch, key)
            n += 1
            yield {**by_key[key], "task_id": dispatch, "_dispatch": dispatch}

    async def evaluate() -> EvalPoint:
        t0 = time.monotonic()
        clock = train_clock()
        summary = RunSummary()
        if eval_tasks:
            summary = await run_workflow(client, eval_workflow, eval_tasks, group_size=1,
                                         concurrency=settings.concurrency, eval=True)
        st = await client.status()
        return EvalPoint(seconds=time.monotonic() - start, train_seconds=clock, train_steps=st.train_steps,
                         policy_version=summary.last_policy_version if eval_tasks else st.policy_version,
                         reward=summary.mean_reward, episodes=summary.episodes - summary.failed,
                         eval_seconds=time.monotonic() - t0)

    async def gated_eval() -> None:
        nonlocal paused_s
        gate.clear()
        await _control(client, "pause")
        deadline = time.monotonic() + settings.gate_timeout_s
        while active and time.monotonic() < deadline:  # in-flight calls finish on the training clock
            await asyncio.sleep(0.1)
        t0 = time.monotonic()
        if at_pause is not None:
            await at_pause(train_clock())
        point = await evaluate()
        run.evals.append(point)
        if stopping is not None and eval_tasks:
            stopping.observe_eval(point.reward)
        if on_eval:
            on_eval(point)
        await _control(client, "resume")
        gate.set()
        paused_s += time.monotonic() - t0

    pause_points = sorted(settings.eval_at_s)

    next_eval = settings.eval_every_s  # the training-clock time of the next periodic eval

    def pause_due() -> bool:
        nonlocal next_eval
        if pause_points:
            if train_clock() >= pause_points[0]:
                while pause_points and train_clock() >= pause_points[0]:
                    pause_points.pop(0)
                return True
            return False
        # periodic evals at multiples of eval_every_s strictly inside the budget (the final eval ends the run)
        every = settings.eval_every_s
        if every is None or next_eval is None or next_eval >= settings.time_budget_s or train_clock() < next_eval:
            return False
        while next_eval <= train_clock():
            next_eval += every
        return True

    async def monitor() -> None:
        last_steps = -1
        quiet_since = time.monotonic()
        while not done.is_set():
            st = await client.status()
            now = time.monotonic()
            if st.train_steps != last_steps:
                if last_steps >= 0:
                    point = StepPoint(now - start, st.train_steps, st.policy_version, dict(st.last_train_metrics))
                    run.steps.append(point)
                    if on_step:
                        on_step(point)
                last_steps, quiet_since = st.train_steps, now
            elif now - quiet_since > 60:
                quiet_since = now
                if on_quiet:
                    on_quiet(st)
            if pause_due():  # before the stop checks: a pause point at the budget still runs
                await gated_eval()
            reason = None
            if settings.max_steps is not None and st.train_steps >= settings.max_steps:
                reason = "steps"
            elif train_clock() > settings.time_budget_s:
                reason = "time_budget"
            elif stopping is not None and (why := stopping.check(curriculum is not None and curriculum.exhausted)):
                reason = why.value
            if reason:
                run.stop_reason = reason
                done.set()
                gate.set()
                return
            await asyncio.sleep(settings.poll_s)

    if eval_tasks:
        first = await evaluate()
        first.seconds = first.train_seconds = 0.0
        run.evals.append(first)
        if stopping is not None:
            stopping.observe_eval(first.reward)
        if on_eval:
            on_eval(first)
    start, paused_s = time.monotonic(), 0.0  # the clocks start with training
    async def watch() -> None:
        try:
            await monitor()
        except Exception:  # a monitor that cannot reach the server must not leave training running forever
            log.exception("the training monitor failed; stopping the run")
            run.stop_reason = run.stop_reason or "monitor_error"
            raise
        finally:
            done.set()
            gate.set()

    watcher = asyncio.create_task(watch())
    try:
        run.train = await run_workflow(client, train_workflow, tasks(), group_size=settings.group_size,
                                       concurrency=settings.concurrency, stop=done)
    finally:
        done.set()
        gate.set()
        with contextlib.suppress(Exception):
            await watcher
    run.seconds = time.monotonic() - start
    run.train_seconds = train_clock()
    if eval_tasks:
        await _control(client, "pause")
        final = await evaluate()
        run.evals.append(final)
        if on_eval:
            on_eval(final)
        await _control(client, "resume")
    if curriculum is not None:
        run.curriculum = curriculum.counts()
    return run
