"""The offline planner: Optuna proposes configurations (TPE, random, or a grid in order) and judges runs
(successive halving / ASHA, stopping only runs that are clearly behind).

Every run of the study is one Optuna trial. The study on disk is the source of truth: on a restart the
Optuna study is rebuilt from it (finished runs are added back with their eval points and ASHA rungs;
running ones get a fresh trial with their points replayed).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from typing import Any, Protocol

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.pruners import BasePruner, NopPruner, SuccessiveHalvingPruner
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from agentjet.apps.research.spec import Direction, Param, ParamType, PlannerKind, Scalar, StudySpec
from agentjet.apps.research.state import StudyState, TrialRecord, TrialState

optuna.logging.set_verbosity(optuna.logging.WARNING)

TPE_STARTUP = 4  # TPE's first picks are random; small budgets need it to start modelling early


@dataclass(frozen=True)
class Proposal:
    params: dict[str, Scalar]
    source: str
    why: str


class Planner(Protocol):
    def propose(self, state: StudyState) -> Proposal | None: ...


def params_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def to_distribution(p: Param) -> BaseDistribution:
    if p.type is ParamType.CHOICE:
        return CategoricalDistribution(list(p.choices or []))
    assert p.low is not None and p.high is not None
    if p.type is ParamType.INT:
        return IntDistribution(int(p.low), int(p.high), log=p.log)
    return FloatDistribution(p.low, p.high, log=p.log)


class ClearlyBehindPruner(BasePruner):
    """Stop a run only when the wrapped pruner (ASHA) says so and it trails the best other run at the same
    step by more than ``min_delta``: small gaps between noisy evals do not kill a run."""

    def __init__(self, inner: BasePruner, min_delta: float, direction: Direction) -> None:
        self.inner = inner
        self.min_delta = min_delta
        self.direction = direction

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        if not self.inner.prune(study, trial):
            return False
        step = trial.last_step
        if step is None:
            return False
        value = trial.intermediate_values[step]
        if math.isnan(value):
            return True
        best = best_other_at(study.get_trials(deepcopy=False), trial.number, step, self.direction)
        if best is None:
            return False
        behind = best - value if self.direction is Direction.MAXIMIZE else value - best
        return behind > self.min_delta


def best_other_at(trials: list[FrozenTrial], number: int, step: int, direction: Direction) -> float | None:
    """The best value other runs had at ``step`` (each at its latest eval point not after it)."""
    values = []
    for t in trials:
        if t.number == number or t.state is OptunaState.FAIL:
            continue
        steps = [s for s in t.intermediate_values if s <= step and math.isfinite(t.intermediate_values[s])]
        if steps:
            values.append(t.intermediate_values[max(steps)])
    if not values:
        return None
    return max(values) if direction is Direction.MAXIMIZE else min(values)


def _json_safe(attrs: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in attrs.items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            continue
        out[k] = v
    return out


class OptunaPlanner:
    def __init__(self, spec: StudySpec) -> None:
        self.spec = spec
        self.distributions = {name: to_distribution(p) for name, p in spec.space.items()}
        kind = spec.planner.kind
        if kind in (PlannerKind.TPE, PlannerKind.LLM):
            sampler: optuna.samplers.BaseSampler = optuna.samplers.TPESampler(
                seed=spec.planner.seed, constant_liar=True, n_startup_trials=TPE_STARTUP)
        else:  # grid points are enqueued in order; random draws for `random`
            sampler = optuna.samplers.RandomSampler(seed=spec.planner.seed)
        es = spec.early_stop
        pruner: BasePruner = NopPruner()
        if es.enabled:
            pruner = ClearlyBehindPruner(
                SuccessiveHalvingPruner(min_resource=spec.first_rung(), reduction_factor=es.reduction_factor),
                es.min_delta, spec.metric.direction)
        self.study = optuna.create_study(direction=spec.metric.direction.value, sampler=sampler, pruner=pruner)
        self._live: dict[str, optuna.Trial] = {}  # run id -> its Optuna trial
        self._fresh: dict[str, optuna.Trial] = {}  # params key -> trial asked by propose(), not yet bound

    # ------------------------------------------------------------------ proposing
    def default_proposal(self, state: StudyState) -> Proposal | None:
        """The baseline first, when the spec asks for it and every parameter has a default."""
        if not self.spec.planner.include_default or state.configs:
            return None
        params = self.spec.default_params()
        if params is None:
            return None
        return Proposal(params, "default", "the default configuration: the baseline every other one is compared to")

    def grid(self) -> list[dict[str, Scalar]]:
        names = list(self.spec.space)
        return [dict(zip(names, combo, strict=True))
                for combo in itertools.product(*(self.spec.space[n].grid_points() for n in names))]

    def propose(self, state: StudyState) -> Proposal | None:
        first = self.default_proposal(state)
        if first is not None:
            return first
        if self.spec.planner.kind is PlannerKind.GRID:
            tried = {params_key(c.params) for c in state.configs}
            grid = self.grid()
            for i, params in enumerate(grid):
                if params_key(params) not in tried:
                    return Proposal(params, "grid", f"grid point {i + 1} of {len(grid)}")
            return None
        return self.sample(state)

    def space_size(self) -> int | None:
        """How many distinct configurations the space holds, when that is finite."""
        size = 1
        for p in self.spec.space.values():
            if p.type is ParamType.FLOAT:
                return None
            size *= len(p.choices or []) if p.type is ParamType.CHOICE else int(p.high or 0) - int(p.low or 0) + 1
        return size

    def sample(self, state: StudyState) -> Proposal | None:
        """A new configuration from the sampler; None when a finite space has been tried in full. A repeat
        of a tried configuration is asked again (seeds already repeat each configuration)."""
        tried = {params_key(c.params) for c in state.configs}
        size = self.space_size()
        if size is not None and len(tried) >= size:
            return None
        for _ in range(50):
            trial = self.study.ask(self.distributions)
            params = {name: trial.params[name] for name in self.spec.space}
            if params_key(params) not in tried:
                break
            self.study.tell(trial, state=OptunaState.FAIL)  # a repeat: not run, and ignored by the sampler
        else:
            return None
        self._fresh[params_key(params)] = trial
        finished = sum(t.state is TrialState.DONE for t in state.trials)
        if self.spec.planner.kind is PlannerKind.RANDOM:
            source, why = "random", "a random draw from the space"
        elif finished < TPE_STARTUP:
            source, why = "tpe", f"exploration: TPE's first {TPE_STARTUP} picks are random ({finished} runs finished)"
        else:
            source, why = "tpe", f"TPE: the region most likely to beat the {finished} finished runs"
        return Proposal(params, source, why)

    # ------------------------------------------------------------------ runs
    def restore(self, state: StudyState) -> None:
        """Add the finished runs of an earlier session back into the (in-memory) Optuna study."""
        for run in state.trials:
            if not run.state.final or not run.attempts:
                continue
            value = run.value(self.spec.metric)
            ostate = {TrialState.DONE: OptunaState.COMPLETE, TrialState.PRUNED: OptunaState.PRUNED}.get(
                run.state, OptunaState.FAIL)
            if ostate is OptunaState.COMPLETE and value is None:
                ostate = OptunaState.FAIL
            self.study.add_trial(optuna.trial.create_trial(
                params=run.params, distributions=self.distributions, state=ostate,
                value=value if ostate is OptunaState.COMPLETE else None,
                intermediate_values={p.train_steps: p.reward for p in run.points}, system_attrs=run.optuna_attrs))

    def begin(self, run: TrialRecord) -> None:
        """Bind a live Optuna trial to a run that starts (or restarts, or is re-attached) and replay its points."""
        trial = self._fresh.pop(params_key(run.params), None)
        if trial is None:
            self.study.enqueue_trial(run.params)
            trial = self.study.ask(self.distributions)
        self._live[run.id] = trial
        for p in run.points:
            trial.report(p.reward, p.train_steps)

    def report(self, run: TrialRecord, step: int, value: float) -> bool:
        """Record an eval point; True when the run should be stopped (clearly behind)."""
        trial = self._live.get(run.id)
        if trial is None:
            return False
        trial.report(value, step)
        return trial.should_prune()

    def best_other(self, run: TrialRecord, step: int) -> float | None:
        trial = self._live.get(run.id)
        number = trial.number if trial is not None else -1
        return best_other_at(self.study.get_trials(deepcopy=False), number, step, self.spec.metric.direction)

    def finish(self, run: TrialRecord) -> None:
        """Tell Optuna how a run ended, and keep its bookkeeping (ASHA rungs) in the run's record."""
        trial = self._live.pop(run.id, None)
        if trial is None:
            return
        value = run.value(self.spec.metric)
        if run.state is TrialState.DONE and value is not None:
            self.study.tell(trial, value)
        elif run.state is TrialState.PRUNED:
            self.study.tell(trial, state=OptunaState.PRUNED)
        else:
            self.study.tell(trial, state=OptunaState.FAIL)
        frozen = self.study.get_trials(deepcopy=False)[trial.number]
        run.optuna_attrs = _json_safe(dict(frozen.system_attrs))

    def abandon(self, run: TrialRecord) -> None:
        """An attempt that crashed: its trial fails; the next attempt gets a fresh one."""
        trial = self._live.pop(run.id, None)
        if trial is not None:
            self.study.tell(trial, state=OptunaState.FAIL)
