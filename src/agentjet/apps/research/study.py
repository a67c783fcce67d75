"""One study: its spec, its state on disk, the planners that propose and judge its runs, and the executor that
runs them, owned by one object. Every change of a run goes through it (an attempt started, re-attached or
stopped; an eval point; a run pruned, finished, failed or given up for a retry), with the planner told and the
state saved after each, so a restarted ``ajet research`` continues where it was. The loop that watches the runs
and applies the health rules is :class:`agentjet.apps.research.runner.StudyRunner`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from agentjet.apps.research.executor import LocalExecutor, TrialExecutor, TrialHandle, TrialTemplate
from agentjet.apps.research.llm_planner import LLMPlanner
from agentjet.apps.research.monitor import TrialResult, Watch, result_points
from agentjet.apps.research.planner import OptunaPlanner, Planner
from agentjet.apps.research.results import StudyResults
from agentjet.apps.research.spec import PlannerKind, StudySpec
from agentjet.apps.research.state import Attempt, StudyStore, TrialRecord, TrialState
from agentjet.runtime.clock import Clock, SystemClock


@dataclass
class ActiveRun:
    """A run with an attempt under way in this session: its executor's handle and what has been seen of it."""

    run: TrialRecord
    handle: TrialHandle
    watch: Watch
    dir: Path
    train_steps: int = 0


class Study:
    """One study: its spec, its state on disk, its planners and its executor. Opening it takes its directory for
    this process (a lock) and checks that the directory holds this study (the digest of its question, metric, base,
    client, space and seeds); use it as a context manager, whose exit saves the state, writes the results table and
    lets the directory go.

    ``executor``: where the runs execute (default: this machine); one given is shared (the studies of a program)
    and closed by its owner. ``event``: where one line per event goes (the display)."""

    def __init__(self, spec: StudySpec, root: Path, executor: TrialExecutor | None = None,
                 event: Callable[[str], None] = lambda _: None, clock: Clock | None = None) -> None:
        self.spec = spec
        self.template = TrialTemplate.of(spec)
        self.event = event
        self.clock = clock or SystemClock()
        self.executor: TrialExecutor = executor or LocalExecutor()
        self._own_executor = executor is None
        self.store = StudyStore(root)
        try:
            self.executor.check(self.template)
            self.state = self.store.open(spec)
        except BaseException:
            if self._own_executor:
                self.executor.close()
            raise
        self._elapsed_before = self.state.elapsed_s
        self._session_start = self.clock.monotonic()
        self.optuna = OptunaPlanner(spec)  # tracks every run and judges it (ASHA)
        self.optuna.restore(self.state)
        self._llm = LLMPlanner(spec, self.optuna, note=event) if spec.planner.kind is PlannerKind.LLM else None
        self.planner: Planner = self._llm or self.optuna  # proposes configurations
        self.active: dict[str, ActiveRun] = {}
        self.exhausted = False  # the planner has no new configuration

    # ------------------------------------------------------------------ the session
    def __enter__(self) -> Study:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.save()
            self.results.write(self.store.root)
        finally:
            if self._own_executor:
                self.executor.close()
            if self._llm is not None:
                self._llm.close()
            self.store.release()

    @property
    def results(self) -> StudyResults:
        return StudyResults(self.spec, self.state)

    def elapsed(self) -> float:
        """Study time: this session's and the earlier sessions'."""
        return self._elapsed_before + (self.clock.monotonic() - self._session_start)

    def save(self) -> None:
        self.state.elapsed_s = self.elapsed()
        self.store.save(self.state)

    def note(self, text: str) -> None:
        """An event that the study keeps (``study.json``'s notes)."""
        self.state.notes.append(text)
        self.event(text)

    # ------------------------------------------------------------------ budget and planning
    def time_left(self) -> bool:
        minutes = self.spec.budget.minutes
        return minutes is None or self.elapsed() < minutes * 60

    def fill(self) -> None:
        """Start runs until ``parallel`` are under way, or the budget or the planner has no more."""
        while len(self.active) < self.spec.parallel and self.time_left():
            run = self._next_run()
            if run is None:
                return
            self.start(run)

    def _next_run(self) -> TrialRecord | None:
        """A planned run, else the first run of a new configuration from the planner (None: no room, or none)."""
        run = next((t for t in self.state.trials if t.state is TrialState.PLANNED), None)
        if run is not None:
            return run
        trials = self.spec.budget.trials
        if self.exhausted or (trials is not None and len(self.state.trials) + self.spec.seeds > trials):
            return None
        proposal = self.planner.propose(self.state)
        if proposal is None:
            self.exhausted = True
            self.note("the planner has no new configuration to try (the space is exhausted)")
            return None
        config = self.state.add_config(proposal.params, proposal.source, proposal.why, self.spec.seeds)
        self.note(f"{config.id} ({proposal.source}): {proposal.params} - {proposal.why}")
        return next(t for t in self.state.trials if t.config_id == config.id)

    # ------------------------------------------------------------------ attempts
    def start(self, run: TrialRecord) -> None:
        """A new attempt of ``run`` (its earlier points dropped), under way."""
        number = len(run.attempts) + 1
        adir = self.store.attempt_dir(run, number)
        adir.mkdir(parents=True, exist_ok=True)
        attempt = Attempt(number=number, started_at=time.time(), port=0)
        handle = self.executor.launch(self.template, run, attempt, adir)
        run.begin(attempt)
        self.optuna.begin(run)
        self.active[run.id] = ActiveRun(run, handle, Watch(started=self.clock.monotonic()), adir)
        self.save()
        where = f" on {attempt.node}" if attempt.node else ""
        self.event(f"{run.id} started (attempt {number}, seed {run.seed}{where}): {run.params}")

    def attach(self, run: TrialRecord) -> ActiveRun:
        """The last attempt of a run an earlier session left running, alive or not (its handle's poll says); its
        clocks count from the attempt's start. Not under way until :meth:`resume`."""
        attempt = run.attempt
        assert attempt is not None
        adir = self.store.attempt_dir(run, attempt.number)
        handle = self.executor.attach(self.template, run, attempt, adir)
        ago = max(0.0, time.time() - attempt.started_at)
        return ActiveRun(run, handle, Watch(started=self.clock.monotonic() - ago), adir)

    def resume(self, active: ActiveRun) -> None:
        """A re-attached attempt is under way again (the planner replays its points)."""
        self.optuna.begin(active.run)
        self.active[active.run.id] = active

    def stop(self, active: ActiveRun, outcome: str) -> None:
        """Stop the attempt's processes and record how it ended; the run's state is the caller's to set."""
        active.handle.stop(self.spec.health.stop_grace_s, self.spec.health.keep_checkpoints)
        attempt = active.run.attempt
        if attempt is not None:
            active.handle.record(attempt)
            attempt.ended_at = time.time()
            attempt.outcome = outcome
            active.run.seconds += attempt.ended_at - attempt.started_at
        self.active.pop(active.run.id, None)

    def abandon(self, active: ActiveRun, outcome: str) -> None:
        """Stop an attempt that ended without a verdict (a crash, a lost node): its planner trial fails, and the
        next attempt gets a fresh one."""
        self.stop(active, outcome)
        self.optuna.abandon(active.run)

    # ------------------------------------------------------------------ verdicts
    def add_point(self, run: TrialRecord, step: int, value: float) -> bool:
        """Record an eval point of a run under way; True when the planner says it is clearly behind."""
        return run.add_point(step, value) and self.optuna.report(run, step, value)

    def end(self, run: TrialRecord, final: TrialState, reason: str) -> None:
        """A run's final state: done, failed or pruned (never started again)."""
        run.move(final, reason)
        self.optuna.finish(run)
        self.event(f"{run.id} {final.value}: {run.reason}")
        self.save()

    def finish(self, active: ActiveRun, result: TrialResult) -> None:
        """The client wrote its result: every eval point in it, and the run done (failed without a point after
        training)."""
        self.stop(active, "finished")
        source = self.spec.metric.source
        for step, value in sorted(result_points(result, source).items()):
            self.add_point(active.run, step, value)
        final = self.results.value(active.run)
        if final is None:
            self.end(active.run, TrialState.FAILED, "finished without an eval point after training")
        else:
            self.end(active.run, TrialState.DONE, f"{result.stop_reason}; {source} {final:.3f}")

    def prune(self, active: ActiveRun, step: int, value: float) -> None:
        """Stop a run that is clearly behind; its configuration's seeds not started yet are pruned with it."""
        run = active.run
        best = self.optuna.best_other(run, step)
        self.stop(active, "pruned")
        self.state.prune_unstarted(run, f"not run: seed {run.seed} of this configuration was pruned at step {step}")
        behind = f", best run at that point {best:.3f}" if best is not None else ""
        self.end(run, TrialState.PRUNED, f"stopped at step {step}: {value:.3f}{behind} (clearly behind)")
