"""One train → pause → evaluate driver: train through a :class:`SwarmClient`, pause at points of the training
clock or at train-step counts to evaluate, stop on a step count, a training-time budget or a stopping rule. What
it does is a :class:`RunSettings` (``agentjet.client.settings``: the run's client-side settings, declared once).

    driver = Driver(client, workflow, RunSettings(group_size=8, concurrency=32, eval_every_s=120, max_steps=40),
                    evaluate=held_out(client, eval_workflow, eval_tasks))
    run = await driver.run(itertools.cycle(tasks))
    run.evals  # EvalPoint: train_steps, train_seconds, policy_version, reward, ...
    run.steps  # StepPoint for each train step seen

**A pause** is the same everywhere: new training workflows wait at a gate; training is paused with
``SwarmClient.pause(wait_for_step=True)`` (the answer waits for a train step in progress; a refusal, e.g. without
the admin token, is logged and the run goes on); the training workflows already running finish (at most
``gate_timeout_s``); ``at_pause(train_seconds)`` and the evaluation run; training resumes and the gate opens.

**The training clock** is the injected clock's time since training started, less the pauses (from the moment
the in-flight workflows have finished until training resumes). Pause points and the time budget count it.

**Evaluations**, when ``evaluate`` is given: one before training (the base point), one at each pause, one at the
end (after the last training workflow finished). An evaluation returns the eval episodes' ``RunSummary`` (the
point's reward), or ``EvalScores`` with each task type's difficulty level and the reward at it beside it. Periodic points (``eval_every_*``) lie strictly inside the budget
(the end has its own eval); fixed points (``eval_at_*``) pause wherever they fall, a point at the budget included.

**Stopping**: ``max_steps`` train steps (the server's count), ``time_budget_s`` of training time, a
:class:`StopRule` (``agentjet.schedule.StoppingRule`` is one; it sees every eval's reward), or the end of the
tasks. Once stopped, no episode begins; the running ones finish. The status is polled every ``poll_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from agentjet.client.client import Episode, SwarmClient, SwarmError
from agentjet.client.runner import RunSummary, Workflow, run_workflow
from agentjet.client.settings import Budget, PauseAt, PauseEvery, Pauses, RunSettings
from agentjet.protocol import (  # EvalPoint re-exported
    BestCheckpoint,
    EvalPoint,
    PauseState,
    Reward,
    ServerStatus,
)
from agentjet.runtime.clock import Clock, SystemClock

log = logging.getLogger(__name__)


class StepPoint(BaseModel):
    """A train step, as the status showed it (metrics of the latest step; a NaN metric is NaN)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")
    seconds: float
    train_seconds: float
    train_steps: int
    policy_version: int
    metrics: dict[str, float]


class StopRule(Protocol):
    """An optional stopping rule (``agentjet.schedule.StoppingRule`` is one)."""

    def observe_eval(self, value: float) -> None: ...

    def check(self) -> str | None: ...


class _Hold(enum.Enum):
    FREE = "free"
    HELD = "held"  # the server paused training
    REFUSED = "refused"  # the server refused to pause (logged): training goes on


class Stop(enum.StrEnum):
    STEPS = "steps"
    TIME_BUDGET = "time_budget"
    TASKS = "tasks"  # the task source ran out
    MONITOR_ERROR = "monitor_error"  # the status could not be read (logged with its error)


@dataclass
class EvalScores:
    """What an evaluation scored: the held-out tasks as named (``summary``, the eval point's reward) and, with
    difficulty levels, each task type's current level and the held-out reward at it."""

    summary: RunSummary
    levels: dict[str, int] = field(default_factory=dict)
    level_rewards: dict[str, float] = field(default_factory=dict)


Evaluate = Callable[[], Awaitable[RunSummary | EvalScores]]


def held_out(client: SwarmClient, workflow: Workflow, tasks: list[dict[str, Any]], concurrency: int) -> Evaluate:
    """An evaluation: ``tasks`` as eval episodes (one each, never trained on), ``concurrency`` at a time (the
    run's, ``RunSettings.concurrency``)."""

    async def evaluate() -> RunSummary:
        return await run_workflow(client, workflow, tasks, group_size=1, concurrency=concurrency, eval=True)

    return evaluate


@dataclass
class DriverRun:
    evals: list[EvalPoint] = field(default_factory=list)
    steps: list[StepPoint] = field(default_factory=list)
    train: RunSummary = field(default_factory=RunSummary)
    stop_reason: str = ""
    train_seconds: float = 0.0  # the training clock at the end
    seconds: float = 0.0  # since training started, pauses included
    best: BestCheckpoint | None = None  # with ``keep_best``: the run's best checkpoint, as the server last said

    @property
    def merge_ratio(self) -> float:
        """Chat calls per training sample in the finished training episodes (1.0: nothing merged)."""
        return self.train.merge_ratio


class _Gate:
    """New training workflows wait here while a pause is on; counts the ones past it."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self.active = 0

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def wrap(self, workflow: Workflow) -> Workflow:
        async def gated(task: dict[str, Any], ep: Episode) -> Reward:
            await self._open.wait()
            self.active += 1
            try:
                return await workflow(task, ep)
            finally:
                self.active -= 1

        return gated

    async def drain(self, clock: Clock, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Until no workflow is past the gate, or ``timeout_s``; whether they all finished."""
        deadline = clock.monotonic() + timeout_s
        while self.active and clock.monotonic() < deadline:
            await clock.sleep(poll_s)
        return not self.active


class _TrainClock:
    """Time since training started, with and without the pauses."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._start: float | None = None
        self._paused = 0.0

    def begin(self) -> None:
        self._start, self._paused = self.clock.monotonic(), 0.0

    def seconds(self) -> float:
        return 0.0 if self._start is None else self.clock.monotonic() - self._start

    def train_seconds(self) -> float:
        return 0.0 if self._start is None else self.seconds() - self._paused

    def add_pause(self, seconds: float) -> None:
        if self._start is not None:
            self._paused += seconds


class _Schedule:
    """Which pause is due, by the training clock and the server's train steps."""

    def __init__(self, pauses: Pauses | None, budget: Budget) -> None:
        at = pauses if isinstance(pauses, PauseAt) else PauseAt()
        every = pauses if isinstance(pauses, PauseEvery) else PauseEvery()
        self._at_s, self._at_steps = sorted(at.seconds), sorted(at.steps)
        self._every_s, self._every_steps = every.seconds, every.steps
        self._next_s, self._next_step = every.seconds or math.inf, every.steps or math.inf
        self._end_s = budget.train_seconds if budget.train_seconds is not None else math.inf
        self._end_steps = budget.max_steps if budget.max_steps is not None else math.inf

    def due(self, train_s: float, steps: int) -> bool:
        hit = bool(self._at_s and train_s >= self._at_s[0]) or bool(self._at_steps and steps >= self._at_steps[0])
        self._at_s = [s for s in self._at_s if s > train_s]
        self._at_steps = [n for n in self._at_steps if n > steps]
        if self._every_s is not None and train_s >= self._next_s:
            hit |= self._next_s < self._end_s and train_s < self._end_s  # seen only after the budget: the end's eval
            while self._next_s <= train_s:  # points missed while paused or polling count once
                self._next_s += self._every_s
        if self._every_steps is not None and steps >= self._next_step:
            hit |= self._next_step < self._end_steps and steps < self._end_steps
            while self._next_step <= steps:
                self._next_step += self._every_steps
        return hit


def _until(tasks: Iterable[dict[str, Any]], stop: asyncio.Event) -> Iterator[dict[str, Any]]:
    """``tasks`` until ``stop``; checked before each draw, so a drawing task source (a curriculum) draws no task
    after the stop."""
    it = iter(tasks)
    while not stop.is_set():
        try:
            yield next(it)
        except StopIteration:
            return


class Driver:
    """Train → pause → evaluate, once (see the module docstring). Hooks: ``at_pause(train_seconds)`` at each
    pause during training, before its eval (a benchmark saves a checkpoint there); ``on_eval``, ``on_step``;
    ``on_quiet(status)`` after ``quiet_s`` without a train step. ``admin_token`` pauses and resumes training
    (default: the client's token)."""

    def __init__(self, client: SwarmClient, train_workflow: Workflow, settings: RunSettings | None = None, *,
                 evaluate: Evaluate | None = None, clock: Clock | None = None, admin_token: str | None = None,
                 at_pause: Callable[[float], Awaitable[None]] | None = None,
                 on_eval: Callable[[EvalPoint], None] | None = None,
                 on_step: Callable[[StepPoint], None] | None = None,
                 on_quiet: Callable[[ServerStatus], None] | None = None) -> None:
        self.client = client
        self.settings = settings or RunSettings()
        self.evaluate = evaluate
        self.clock: Clock = clock or SystemClock()
        self.admin_token = admin_token
        self.at_pause, self.on_eval, self.on_step, self.on_quiet = at_pause, on_eval, on_step, on_quiet
        self._gate = _Gate()
        self._workflow = self._gate.wrap(train_workflow)
        self._train_clock = _TrainClock(self.clock)
        self._stopped = asyncio.Event()
        self._hold_state = _Hold.FREE
        self._held: PauseState | None = None  # the server's answer to the pause in force
        self._ran = False

    @property
    def stopped(self) -> bool:
        """Whether the run has stopped (no episode begins any more)."""
        return self._stopped.is_set()

    async def run(self, tasks: Iterable[dict[str, Any]], stopping: StopRule | None = None) -> DriverRun:
        """Train on ``tasks`` (an endless iterable, e.g. ``itertools.cycle``, unless the tasks should end the run)
        until a stop condition: the settings' budget, ``stopping``, or the end of the tasks."""
        if self._ran:
            raise RuntimeError("a Driver runs once; make a new one")
        self._ran = True
        pauses, budget = self.settings.pauses(), self.settings.budget()
        run = DriverRun()
        if self.evaluate is not None:
            await self._pause(run, stopping, during_training=False)  # the base point
        self._train_clock.begin()
        watcher = asyncio.create_task(self._watch(run, _Schedule(pauses, budget), budget, stopping))
        try:
            run.train = await run_workflow(self.client, self._workflow, _until(tasks, self._stopped),
                                           group_size=self.settings.group_size,
                                           concurrency=self.settings.concurrency, stop=self._stopped)
        finally:
            self._end_training()
            with contextlib.suppress(Exception):  # the watcher logged its error; the run ends with what it has
                await watcher
        run.stop_reason = run.stop_reason or Stop.TASKS
        run.seconds, run.train_seconds = self._train_clock.seconds(), self._train_clock.train_seconds()
        if self.evaluate is not None:
            await self._pause(run, stopping, during_training=False)  # the end point
        return run

    # ---------------------------------------------------------------- watching the status
    async def _watch(self, run: DriverRun, schedule: _Schedule, budget: Budget, stopping: StopRule | None) -> None:
        try:
            await self._poll(run, schedule, budget, stopping)
        except Exception:  # a watcher that cannot reach the server must not leave training running forever
            log.exception("the training monitor failed; stopping the run")
            run.stop_reason = run.stop_reason or Stop.MONITOR_ERROR
            raise
        finally:
            self._end_training()

    async def _poll(self, run: DriverRun, schedule: _Schedule, budget: Budget, stopping: StopRule | None) -> None:
        last_steps: int | None = None
        quiet_since = self.clock.monotonic()
        while not self._stopped.is_set():
            st = await self.client.status()
            now = self.clock.monotonic()
            if st.train_steps != last_steps:
                if last_steps is not None:
                    self._record_step(run, st)
                last_steps, quiet_since = st.train_steps, now
            elif now - quiet_since > self.settings.quiet_s:
                quiet_since = now
                if self.on_quiet:
                    self.on_quiet(st)
            if schedule.due(self._train_clock.train_seconds(), st.train_steps):  # before the stop checks
                await self._pause(run, stopping, during_training=True)
            reason = self._stop_reason(st, budget, stopping)
            if reason is not None:
                run.stop_reason = reason
                # Training is not paused here: begins held by the server for capacity (its long poll) get it
                # only from further train steps, so pausing now left the run waiting on them for the client's
                # whole defer timeout. The episodes in flight finish on a live trainer; the end point pauses.
                self._end_training()
                return
            await self.clock.sleep(self.settings.poll_s)

    def _record_step(self, run: DriverRun, st: ServerStatus) -> None:
        metrics = {k: math.nan if v is None else float(v) for k, v in st.last_train_metrics.items()}
        point = StepPoint(seconds=self._train_clock.seconds(), train_seconds=self._train_clock.train_seconds(),
                          train_steps=st.train_steps, policy_version=st.policy_version, metrics=metrics)
        run.steps.append(point)
        if self.on_step:
            self.on_step(point)

    def _stop_reason(self, st: ServerStatus, budget: Budget, stopping: StopRule | None) -> str | None:
        if budget.max_steps is not None and st.train_steps >= budget.max_steps:
            return Stop.STEPS
        if budget.train_seconds is not None and self._train_clock.train_seconds() >= budget.train_seconds:
            return Stop.TIME_BUDGET
        return stopping.check() if stopping is not None else None

    def _end_training(self) -> None:
        self._stopped.set()
        self._gate.open()  # workflows waiting at the gate have begun their episodes: they finish

    # ---------------------------------------------------------------- a pause
    async def _pause(self, run: DriverRun, stopping: StopRule | None, *, during_training: bool) -> None:
        self._gate.close()
        held = await self._hold()
        if not await self._gate.drain(self.clock, self.settings.gate_timeout_s):
            log.warning("%d training workflows still running after %.0fs: evaluating anyway", self._gate.active,
                        self.settings.gate_timeout_s)
        t0 = self.clock.monotonic()
        try:
            if during_training and self.at_pause is not None:
                await self.at_pause(self._train_clock.train_seconds())
            if self.evaluate is not None:
                point = await self._eval_point(held)
                run.evals.append(point)
                if stopping is not None:
                    stopping.observe_eval(point.reward)
                if self.settings.keep_best:
                    await self._keep_best(run, point)
                if self.on_eval:
                    self.on_eval(point)
        finally:
            await self._release()
            self._train_clock.add_pause(self.clock.monotonic() - t0)
            if not self._stopped.is_set():
                self._gate.open()

    async def _eval_point(self, held: PauseState | None) -> EvalPoint:
        assert self.evaluate is not None
        where: PauseState | ServerStatus = held or await self.client.status()
        t0, seconds, train_seconds = self.clock.monotonic(), self._train_clock.seconds(), self._train_clock.train_seconds()
        scored = await self.evaluate()
        scores = scored if isinstance(scored, EvalScores) else EvalScores(scored)
        summary = scores.summary
        return EvalPoint(train_steps=where.train_steps, policy_version=where.policy_version,
                         reward=summary.mean_reward, episodes=summary.episodes - summary.failed, failed=summary.failed,
                         train_seconds=train_seconds, seconds=seconds, eval_seconds=self.clock.monotonic() - t0,
                         levels=scores.levels, level_rewards=scores.level_rewards)

    async def _keep_best(self, run: DriverRun, point: EvalPoint) -> None:
        """Pin this step's checkpoint as the best if ``point`` beats the pinned eval (the server decides, so a
        restarted client never moves the pin back). Only while training is held: else the checkpoint could be of
        a later step than the eval. A refusal is logged; the run goes on."""
        if not math.isfinite(point.reward):
            return  # no eval episode finished
        if self._hold_state is not _Hold.HELD:
            log.warning("not pinning the best checkpoint: training was not paused for this eval")
            return
        try:
            answer = await self.client.checkpoint(best_eval=point.reward, admin_token=self.admin_token)
        except SwarmError as exc:
            log.warning("could not pin the best checkpoint (%s)", exc)
            return
        run.best = answer.best
        if answer.pinned:
            log.info("eval %.3f at step %d: pinned as the best checkpoint (%s)", point.reward, point.train_steps,
                     answer.path)

    async def _hold(self) -> PauseState | None:
        """Pause training, waiting for a step in progress (once per pause); None when the server refused
        (logged, not raised: the run goes on, its evals may overlap train steps)."""
        if self._hold_state is _Hold.FREE:
            try:
                self._held = await self.client.pause(wait_for_step=True, admin_token=self.admin_token)
                self._hold_state = _Hold.HELD
            except SwarmError as exc:
                self._hold_state = _Hold.REFUSED
                log.warning("could not pause training (%s): evals may overlap train steps", exc)
        return self._held

    async def _release(self) -> None:
        held, self._hold_state, self._held = self._hold_state, _Hold.FREE, None
        if held is not _Hold.HELD:
            return
        try:
            await self.client.resume(admin_token=self.admin_token)
        except SwarmError as exc:
            log.warning("could not resume training (%s)", exc)
