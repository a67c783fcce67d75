"""Runs a study (:class:`agentjet.apps.research.study.Study`): keeps its runs started (each an `ajet up` spec on
free ports, in a directory of its own, on this machine or on a Ray cluster: :mod:`agentjet.apps.research.executor`),
watches them through their server's status API, and by the health rules stops the ones clearly behind, retries a
crashed one, fails a hopeless one, or aborts a study whose servers never start.

On restart: a run whose `ajet up` is still alive is re-attached to; one whose client finished meanwhile is
collected; any other running run is restarted (a new attempt). Final runs are never started again.
Ctrl-C stops the running runs (they restart on the next start); SIGKILL leaves them running (they are
re-attached to).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from agentjet.apps.research.display import Display, RunView
from agentjet.apps.research.monitor import Health, Limits, Watch, eval_points, judge
from agentjet.apps.research.state import StudyState, TrialState
from agentjet.apps.research.study import ActiveRun, Study

# a run whose node died this many times fails (a cluster that keeps losing nodes)
MAX_LOST = 3


class StudyAborted(RuntimeError):
    """The study cannot go on (every run fails before its server starts, say); the message says why."""


class StudyRunner:
    """The loop over one opened study, until no run is under way (``with Study(...) as study:
    StudyRunner(study).run()``)."""

    def __init__(self, study: Study, display: Display | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.study = study
        self.display = display or Display(None, study.spec)
        self.sleep = sleep
        h = study.spec.health
        self.limits = Limits(h.start_timeout_s, h.stall_s, study.spec.run_timeout_s())

    def run(self) -> StudyState:
        study = self.study
        with self.display:
            try:
                self._recover()
                while True:
                    for active in list(study.active.values()):
                        self._poll(active)
                    study.fill()
                    study.save()
                    self.display.update(study.state, self._views(), study.elapsed())
                    if not study.active:
                        break
                    self.sleep(study.spec.health.poll_s)
                study.state.finished = not study.state.by_state(TrialState.PLANNED, TrialState.RUNNING)
            except KeyboardInterrupt:
                self._stop_all("interrupted: stopping the running runs (they restart on the next start)", "interrupted")
                raise
            except StudyAborted as exc:
                self._stop_all(f"study aborted: {str(exc).splitlines()[0]}", "study aborted")
                raise
        return study.state

    def _stop_all(self, note: str, outcome: str) -> None:
        self.study.note(note)
        for active in list(self.study.active.values()):
            self.study.stop(active, outcome)

    # ------------------------------------------------------------------ watching
    def _poll(self, a: ActiveRun) -> None:
        study = self.study
        look = a.handle.poll()
        attempt = a.run.attempt
        assert attempt is not None
        node = attempt.node
        if a.handle.record(attempt):
            study.save()
            if attempt.node != node and attempt.node:
                study.event(f"{a.run.id} runs on node {attempt.node}")
        if look.lost is not None:
            self._lose(a, look.lost)
            return
        now = study.clock.monotonic()
        if look.waiting is not None:  # not placed yet: its clocks start when it starts
            a.watch = Watch(started=now)
            return
        status = look.status
        a.watch.observe(status, now)
        if status is not None:
            attempt.ready = True
            a.train_steps = status.train_steps
            for step, value in sorted(eval_points(status, study.spec.metric.source).items()):
                if study.add_point(a.run, step, value):
                    study.prune(a, step, value)
                    return
        result = look.result
        health = judge(a.watch, look.alive, result, study.clock.monotonic(), self.limits)
        if health is Health.FINISHED:
            assert result is not None
            study.finish(a, result)
        elif health is Health.NAN_LOSS:
            self._fail(a, f"the loss became NaN at step {a.train_steps}")
        elif health is Health.TIMED_OUT:
            self._fail(a, f"ran past its limit of {self.limits.run_timeout_s:.0f}s")
        elif health.retryable:
            detail = f" ({result.stop_reason})" if result is not None else ""
            self._crash(a, f"{health.value}{detail}")

    def _fail(self, a: ActiveRun, reason: str) -> None:
        self.study.stop(a, reason)
        self.study.end(a.run, TrialState.FAILED, reason)

    def _lose(self, a: ActiveRun, why: str) -> None:
        """The node that ran the attempt is gone: its processes are stopped (where the node still answers), its
        points are dropped, and a new attempt starts wherever the cluster has room. Not a crash: only the retry
        counts."""
        self.study.abandon(a, f"node lost: {why}")
        run = a.run
        run.lost += 1
        if run.lost > MAX_LOST:
            self.study.end(run, TrialState.FAILED, f"its node was lost {run.lost} times; last: {why}")
            return
        self.study.note(f"{run.id} lost its node ({why}); restarting it elsewhere (not counted as a crash)")
        self.study.start(run)

    def _crash(self, a: ActiveRun, what: str) -> None:
        study = self.study
        study.abandon(a, what)
        run = a.run
        run.crashes += 1
        retries = study.spec.health.retries
        if run.crashes <= retries:
            study.note(f"{run.id} {what}; restarting it (retry {run.crashes} of {retries}); log: {a.dir}")
            study.start(run)
            return
        study.end(run, TrialState.FAILED, f"{what} on {run.crashes} attempts; log: {a.dir}")
        never_started = not any(att.ready for t in study.state.trials for att in t.attempts)
        if never_started:
            raise StudyAborted(f"run {run.id} failed {run.crashes} times and no run's server has ever started; "
                               f"the last log:\n{_log_tail(a.dir)}")

    # ------------------------------------------------------------------ restart
    def _recover(self) -> None:
        study = self.study
        for run in study.state.by_state(TrialState.RUNNING):
            active = study.attach(run)
            look = active.handle.poll()
            if look.lost is None and look.result is not None and look.result.ok:
                study.resume(active)
                study.event(f"{run.id} finished while the study was stopped; collecting it")
                study.finish(active, look.result)
            elif look.lost is None and (look.alive or look.waiting is not None):
                study.resume(active)
                attempt = run.attempt
                assert attempt is not None
                where = attempt.actor or f"pid {attempt.pid}"
                study.event(f"{run.id} is still running ({where}): re-attached")
            else:
                study.stop(active, "interrupted")
                study.event(f"{run.id} was interrupted: restarting it")
                study.start(run)
        study.save()

    # ------------------------------------------------------------------ display
    def _views(self) -> list[RunView]:
        now = self.study.clock.monotonic()
        return [RunView(run=a.run, train_steps=a.train_steps, seconds=now - a.watch.started)
                for a in self.study.active.values()]


def _log_tail(attempt_dir: Path, chars: int = 1500) -> str:
    parts = []
    for path in [attempt_dir / "up.log", *sorted((attempt_dir / "logs").glob("*.log"))]:
        if path.exists():
            parts.append(f"--- {path}\n{path.read_text(errors='replace')[-chars:]}")
    return "\n".join(parts) or "(no log)"
