"""Runs a study: starts runs (each an `ajet up` spec on free ports, in a directory of its own, on this machine
or on a Ray cluster: :mod:`agentjet.apps.research.executor`), watches them through their server's status API,
stops the ones clearly behind, retries a crashed one, and keeps the study on disk after every change so that a
restarted ``ajet research`` continues where it was.

On restart: a run whose `ajet up` is still alive is re-attached to; one whose client finished meanwhile is
collected; any other running run is restarted (a new attempt). Final runs are never started again.
Ctrl-C stops the running runs (they restart on the next start); SIGKILL leaves them running (they are
re-attached to).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentjet.apps.research.display import Display, RunView
from agentjet.apps.research.executor import LocalExecutor, TrialExecutor, TrialHandle
from agentjet.apps.research.monitor import (
    Health,
    Limits,
    TrialResult,
    Watch,
    eval_points,
    judge,
    result_points,
)
from agentjet.apps.research.planner import OptunaPlanner, Planner
from agentjet.apps.research.spec import StudySpec, StudySpecError
from agentjet.apps.research.state import Attempt, StudyState, StudyStore, TrialRecord, TrialState
from agentjet.runtime.clock import Clock, SystemClock

# a run whose node died this many times fails (a cluster that keeps losing nodes)
MAX_LOST = 3


class StudyAborted(RuntimeError):
    """The study cannot go on (every run fails before its server starts, say); the message says why."""


@dataclass
class ActiveRun:
    run: TrialRecord
    handle: TrialHandle
    watch: Watch
    dir: Path
    train_steps: int = 0


class StudyRunner:
    def __init__(self, spec: StudySpec, root: Path, planner: Planner, optuna: OptunaPlanner,
                 display: Display | None = None, clock: Clock | None = None,
                 sleep: Callable[[float], None] = time.sleep, executor: TrialExecutor | None = None) -> None:
        self.spec = spec
        self.store = StudyStore(root)
        self.planner = planner
        self.optuna = optuna
        self.display = display or Display(None, spec)
        self.clock = clock or SystemClock()
        self.sleep = sleep
        self.active: dict[str, ActiveRun] = {}
        self.exhausted = False
        self.executor: TrialExecutor = executor or LocalExecutor()
        self._own_executor = executor is None  # one given is shared (the studies of a program) and closed by its owner
        h = spec.health
        self.limits = Limits(h.start_timeout_s, h.stall_s, spec.run_timeout_s())
        self.state = self._open()
        self._elapsed_before = self.state.elapsed_s
        self._session_start = self.clock.monotonic()

    # ------------------------------------------------------------------ study lifecycle
    def _open(self) -> StudyState:
        self.store.acquire()
        try:
            if self.store.exists():
                state = self.store.load()
                if state.digest != self.spec.digest():
                    raise StudySpecError(f"{self.store.root} holds a different study (its question, metric, base, "
                                         "client, space or seeds differ); give another output directory")
            else:
                state = StudyState(digest=self.spec.digest(), created_at=time.time())
            state.sessions += 1
            state.finished = False
            self.store.save_spec(self.spec)
            self.store.save(state)
        except BaseException:
            self.store.release()
            raise
        return state

    def elapsed(self) -> float:
        return self._elapsed_before + (self.clock.monotonic() - self._session_start)

    def _save(self) -> None:
        self.state.elapsed_s = self.elapsed()
        self.store.save(self.state)

    def note(self, text: str) -> None:
        self.state.notes.append(text)
        self.display.event(text)

    def run(self) -> StudyState:
        self.optuna.restore(self.state)
        with self.display:
            try:
                self._recover()
                while True:
                    for active in list(self.active.values()):
                        self._poll(active)
                    self._fill()
                    self._save()
                    self.display.update(self.state, self._views(), self.elapsed())
                    if not self.active:
                        break
                    self.sleep(self.spec.health.poll_s)
                self.state.finished = not self.state.by_state(TrialState.PLANNED, TrialState.RUNNING)
            except KeyboardInterrupt:
                self.note("interrupted: stopping the running runs (they restart on the next start)")
                for active in list(self.active.values()):
                    self._stop(active, "interrupted")
                raise
            except StudyAborted as exc:
                self.note(f"study aborted: {str(exc).splitlines()[0]}")
                for active in list(self.active.values()):
                    self._stop(active, "study aborted")
                raise
            finally:
                self._save()
                self.store.write_results(self.state, self.spec)
                if self._own_executor:
                    self.executor.close()
                self.store.release()
        return self.state

    # ------------------------------------------------------------------ budget and planning
    def _time_left(self) -> bool:
        minutes = self.spec.budget.minutes
        return minutes is None or self.elapsed() < minutes * 60

    def _room_for_config(self) -> bool:
        trials = self.spec.budget.trials
        return trials is None or len(self.state.trials) + self.spec.seeds <= trials

    def _fill(self) -> None:
        while len(self.active) < self.spec.parallel and self._time_left():
            run = next((t for t in self.state.trials if t.state is TrialState.PLANNED), None)
            if run is None:
                if self.exhausted or not self._room_for_config():
                    return
                proposal = self.planner.propose(self.state)
                if proposal is None:
                    self.exhausted = True
                    self.note("the planner has no new configuration to try (the space is exhausted)")
                    return
                config = self.state.add_config(proposal.params, proposal.source, proposal.why, self.spec.seeds)
                self.note(f"{config.id} ({proposal.source}): {proposal.params} - {proposal.why}")
                run = next(t for t in self.state.trials if t.config_id == config.id)
            self._start(run)

    # ------------------------------------------------------------------ starting and stopping runs
    def _start(self, run: TrialRecord) -> None:
        number = len(run.attempts) + 1
        adir = self.store.attempt_dir(run, number)
        adir.mkdir(parents=True, exist_ok=True)
        attempt = Attempt(number=number, started_at=time.time(), port=0)
        handle = self.executor.launch(self.spec, run, attempt, adir)
        run.attempts.append(attempt)
        run.points = []
        run.move(TrialState.RUNNING)
        self.optuna.begin(run)
        self.active[run.id] = ActiveRun(run, handle, Watch(started=self.clock.monotonic()), adir)
        self._save()
        where = f" on {attempt.node}" if attempt.node else ""
        self.display.event(f"{run.id} started (attempt {number}, seed {run.seed}{where}): {run.params}")

    def _stop(self, active: ActiveRun, outcome: str) -> None:
        active.handle.stop(self.spec.health.stop_grace_s, self.spec.health.keep_checkpoints)
        attempt = active.run.attempt
        if attempt is not None:
            active.handle.record(attempt)
            attempt.ended_at = time.time()
            attempt.outcome = outcome
            active.run.seconds += attempt.ended_at - attempt.started_at
        self.active.pop(active.run.id, None)

    # ------------------------------------------------------------------ watching
    def _poll(self, a: ActiveRun) -> None:
        look = a.handle.poll()
        attempt = a.run.attempt
        assert attempt is not None
        node = attempt.node
        if a.handle.record(attempt):
            self._save()
            if attempt.node != node and attempt.node:
                self.display.event(f"{a.run.id} runs on node {attempt.node}")
        if look.lost is not None:
            self._lose(a, look.lost)
            return
        if look.waiting is not None:  # not placed yet: its clocks start when it starts
            a.watch = Watch(started=self.clock.monotonic())
            return
        status = look.status
        a.watch.observe(status, self.clock.monotonic())
        if status is not None:
            attempt.ready = True
            a.train_steps = status.train_steps
            for step, value in sorted(eval_points(status, self.spec.metric.source).items()):
                if a.run.add_point(step, value) and self.optuna.report(a.run, step, value):
                    self._prune(a, step, value)
                    return
        result = look.result
        health = judge(a.watch, look.alive, result, self.clock.monotonic(), self.limits)
        if health is Health.FINISHED:
            assert result is not None
            self._finish(a, result)
        elif health is Health.NAN_LOSS:
            self._fail(a, f"the loss became NaN at step {a.train_steps}")
        elif health is Health.TIMED_OUT:
            self._fail(a, f"ran past its limit of {self.limits.run_timeout_s:.0f}s")
        elif health.retryable:
            detail = f" ({result.stop_reason})" if result is not None else ""
            self._crash(a, f"{health.value}{detail}")

    def _lose(self, a: ActiveRun, why: str) -> None:
        """The node that ran the attempt is gone: its processes are stopped (where the node still answers), its
        points are dropped, and a new attempt starts wherever the cluster has room. Not a crash: only the retry
        counts."""
        self._stop(a, f"node lost: {why}")
        run = a.run
        run.lost += 1
        self.optuna.abandon(run)
        if run.lost > MAX_LOST:
            run.move(TrialState.FAILED, f"its node was lost {run.lost} times; last: {why}")
            self.optuna.finish(run)
            self.display.event(f"{run.id} failed: {run.reason}")
            self._save()
            return
        self.note(f"{run.id} lost its node ({why}); restarting it elsewhere (not counted as a crash)")
        self._start(run)

    def _prune(self, a: ActiveRun, step: int, value: float) -> None:
        best = self.optuna.best_other(a.run, step)
        self._stop(a, "pruned")
        behind = f", best run at that point {best:.3f}" if best is not None else ""
        a.run.move(TrialState.PRUNED, f"stopped at step {step}: {value:.3f}{behind} (clearly behind)")
        self.optuna.finish(a.run)
        self.display.event(f"{a.run.id} pruned: {a.run.reason}")
        for sibling in self.state.siblings(a.run):
            if sibling.state is TrialState.PLANNED:
                sibling.move(TrialState.PRUNED, f"not run: seed {a.run.seed} of this configuration was pruned at "
                                                f"step {step}")
        self._save()

    def _finish(self, a: ActiveRun, result: TrialResult) -> None:
        self._stop(a, "finished")
        for step, value in sorted(result_points(result, self.spec.metric.source).items()):
            if a.run.add_point(step, value):
                self.optuna.report(a.run, step, value)
        final = a.run.value(self.spec.metric)
        if final is None:
            a.run.move(TrialState.FAILED, "finished without an eval point after training")
        else:
            a.run.move(TrialState.DONE, f"{result.stop_reason}; {self.spec.metric.source} {final:.3f}")
        self.optuna.finish(a.run)
        self.display.event(f"{a.run.id} {a.run.state.value}: {a.run.reason}")
        self._save()

    def _fail(self, a: ActiveRun, reason: str) -> None:
        self._stop(a, reason)
        a.run.move(TrialState.FAILED, reason)
        self.optuna.finish(a.run)
        self.display.event(f"{a.run.id} failed: {reason}")
        self._save()

    def _crash(self, a: ActiveRun, what: str) -> None:
        self._stop(a, what)
        run = a.run
        run.crashes += 1
        self.optuna.abandon(run)
        if run.crashes <= self.spec.health.retries:
            self.note(f"{run.id} {what}; restarting it (retry {run.crashes} of {self.spec.health.retries}); "
                      f"log: {a.dir}")
            self._start(run)
            return
        run.move(TrialState.FAILED, f"{what} on {run.crashes} attempts; log: {a.dir}")
        self.display.event(f"{run.id} failed: {run.reason}")
        self._save()
        never_started = not any(att.ready for t in self.state.trials for att in t.attempts)
        if never_started:
            raise StudyAborted(f"run {run.id} failed {run.crashes} times and no run's server has ever started; "
                               f"the last log:\n{_log_tail(a.dir)}")

    # ------------------------------------------------------------------ restart
    def _recover(self) -> None:
        for run in self.state.by_state(TrialState.RUNNING):
            attempt = run.attempt
            assert attempt is not None
            adir = self.store.attempt_dir(run, attempt.number)
            handle = self.executor.attach(self.spec, run, attempt, adir)
            look = handle.poll()
            ago = max(0.0, time.time() - attempt.started_at)
            active = ActiveRun(run, handle, Watch(started=self.clock.monotonic() - ago), adir)
            if look.lost is None and look.result is not None and look.result.ok:
                self.optuna.begin(run)
                self.display.event(f"{run.id} finished while the study was stopped; collecting it")
                self._finish(active, look.result)
            elif look.lost is None and (look.alive or look.waiting is not None):
                self.optuna.begin(run)
                self.active[run.id] = active
                where = attempt.actor or f"pid {attempt.pid}"
                self.display.event(f"{run.id} is still running ({where}): re-attached")
            else:
                self._stop(active, "interrupted")
                self.display.event(f"{run.id} was interrupted: restarting it")
                self._start(run)
        self._save()

    # ------------------------------------------------------------------ display
    def _views(self) -> list[RunView]:
        return [RunView(run=a.run, train_steps=a.train_steps, seconds=self.clock.monotonic() - a.watch.started)
                for a in self.active.values()]


def _log_tail(attempt_dir: Path, chars: int = 1500) -> str:
    parts = []
    for path in [attempt_dir / "up.log", *sorted((attempt_dir / "logs").glob("*.log"))]:
        if path.exists():
            parts.append(f"--- {path}\n{path.read_text(errors='replace')[-chars:]}")
    return "\n".join(parts) or "(no log)"
