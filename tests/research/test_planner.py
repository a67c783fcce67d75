"""The offline planner and the study state: proposals, pruning only when clearly behind, rebuilding after a
restart, the run state machine and the results table."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentjet.apps.research.planner import OptunaPlanner, params_key
from agentjet.apps.research.results import StudyResults
from agentjet.apps.research.spec import StudySpec
from agentjet.apps.research.state import (
    Attempt,
    IllegalTransition,
    StudyBusy,
    StudyState,
    StudyStore,
    TrialState,
)

BASE = {"servers": {"policy": {"model": "tiny-random"}}}


def make_spec(kind: str = "grid", **over) -> StudySpec:
    raw = {"question": "q", "base": BASE, "planner": {"kind": kind},
           "client": {"steps": 6, "eval_every": 2},
           "space": {"server.lr": {"type": "choice", "choices": [1e-5, 1e-4], "default": 1e-5},
                     "server.group-size": {"type": "choice", "choices": [4, 8], "default": 4}},
           "early_stop": {"reduction_factor": 2, "min_delta": 0.1}, **over}
    return StudySpec.model_validate(raw)


def plan_all(planner: OptunaPlanner, state: StudyState, seeds: int = 1) -> list[str]:
    sources = []
    while (p := planner.propose(state)) is not None:
        state.add_config(p.params, p.source, p.why, seeds)
        sources.append(p.source)
    return sources


def test_grid_runs_the_default_first_then_every_other_point_once() -> None:
    spec = make_spec()
    planner, state = OptunaPlanner(spec), StudyState(digest="d", created_at=0)
    assert plan_all(planner, state, seeds=2) == ["default", "grid", "grid", "grid"]
    assert len({params_key(c.params) for c in state.configs}) == 4 and len(state.trials) == 8
    assert state.configs[0].params == {"server.lr": 1e-5, "server.group-size": 4}


def test_tpe_never_repeats_a_configuration_and_stops_when_a_finite_space_is_tried() -> None:
    spec = make_spec("tpe")
    planner, state = OptunaPlanner(spec), StudyState(digest="d", created_at=0)
    sources = plan_all(planner, state)
    assert sources[0] == "default" and len(sources) == 4 and set(sources[1:]) == {"tpe"}
    assert len({params_key(c.params) for c in state.configs}) == 4


def run_to(planner: OptunaPlanner, state: StudyState, index: int, curve: dict[int, float]) -> bool:
    """Start run ``index`` and feed its eval points; True if it was pruned."""
    run = state.trials[index]
    run.attempts.append(Attempt(number=1, started_at=0, port=1))
    run.move(TrialState.RUNNING)
    planner.begin(run)
    for step, value in curve.items():
        run.add_point(step, value)
        if planner.report(run, step, value):
            run.move(TrialState.PRUNED)
            planner.finish(run)
            return True
    run.move(TrialState.DONE)
    planner.finish(run)
    return False


def test_a_run_is_pruned_only_when_asha_says_so_and_it_is_clearly_behind() -> None:
    spec = make_spec()
    planner, state = OptunaPlanner(spec), StudyState(digest="d", created_at=0)
    plan_all(planner, state)
    assert not run_to(planner, state, 0, {0: 0.3, 2: 0.6, 4: 0.7, 6: 0.8})
    assert not run_to(planner, state, 1, {0: 0.3, 2: 0.55, 4: 0.6, 6: 0.7})  # behind, but by less than 0.1
    assert run_to(planner, state, 2, {0: 0.3, 2: 0.2, 4: 0.9})  # clearly behind at step 2: stopped there
    assert state.trials[2].last_step == 2
    assert not run_to(planner, state, 3, {0: 0.3})  # step 0 is before the first rung: never judged


def test_a_rebuilt_planner_judges_like_the_one_that_was_killed(tmp_path: Path) -> None:
    spec = make_spec()
    store = StudyStore(tmp_path)
    planner, state = OptunaPlanner(spec), StudyState(digest="d", created_at=0)
    plan_all(planner, state)
    run_to(planner, state, 0, {0: 0.3, 2: 0.6, 4: 0.7, 6: 0.8})
    run_to(planner, state, 1, {0: 0.3, 2: 0.65, 4: 0.75, 6: 0.8})
    store.save(state)
    reloaded = store.load()
    rebuilt = OptunaPlanner(spec)
    rebuilt.restore(reloaded)
    assert [t.state.name for t in rebuilt.study.trials] == ["COMPLETE", "COMPLETE"]
    assert rebuilt.study.trials[1].system_attrs.get("completed_rung_0") == 0.65  # the ASHA rungs came back
    assert run_to(rebuilt, reloaded, 2, {0: 0.3, 2: 0.3})


def test_the_run_state_machine_refuses_to_leave_a_final_state() -> None:
    state = StudyState(digest="d", created_at=0)
    state.add_config({"server.lr": 1e-5, "server.group-size": 4}, "grid", "x", seeds=1)
    run = state.trials[0]
    with pytest.raises(IllegalTransition):
        run.move(TrialState.DONE)  # planned -> done skips running
    run.move(TrialState.RUNNING)
    run.move(TrialState.RUNNING)  # a retry starts a new attempt
    run.move(TrialState.DONE)
    for target in TrialState:
        with pytest.raises(IllegalTransition):
            run.move(target)


def test_results_table_and_mean_spread_over_seeds(tmp_path: Path) -> None:
    spec = make_spec(seeds=2)
    state = StudyState(digest="d", created_at=0)
    state.add_config({"server.lr": 1e-5, "server.group-size": 4}, "default", "baseline", seeds=2)
    state.add_config({"server.lr": 1e-4, "server.group-size": 8}, "grid", "g", seeds=2)
    for run, curve in zip(state.trials, [{0: 0.2, 6: 0.5}, {0: 0.2, 6: 0.7}, {0: 0.2, 2: 0.1}, {}], strict=True):
        run.move(TrialState.RUNNING)
        for step, value in curve.items():
            run.add_point(step, value)
    state.trials[0].move(TrialState.DONE)
    state.trials[1].move(TrialState.DONE)
    state.trials[2].move(TrialState.PRUNED, "behind")
    state.trials[3].move(TrialState.PRUNED, "sibling pruned")
    results = StudyResults(spec, state)
    rows = {r["config"]: r for r in results.configs()}
    assert rows["c00"]["mean"] == pytest.approx(0.6) and rows["c00"]["sd"] == pytest.approx(0.1414, abs=1e-3)
    assert rows["c01"]["mean"] is None and rows["c01"]["pruned_values"] == [0.1]
    results.write(tmp_path)
    lines = (tmp_path / "results.tsv").read_text().splitlines()
    assert lines[0].split("\t")[:6] == ["run", "config", "seed", "state", "server.lr", "server.group-size"]
    assert lines[1].split("\t")[3] == "done" and lines[1].split("\t")[6] == "0.5000"


def test_one_runner_per_study_directory(tmp_path: Path) -> None:
    first, second = StudyStore(tmp_path), StudyStore(tmp_path)
    first.acquire()
    with pytest.raises(StudyBusy, match=f"pid {os.getpid()}"):
        second.acquire()
    first.release()
    second.acquire()
    second.release()
