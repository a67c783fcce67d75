"""One eval-point record and one curve plot: every producer yields an ``EvalPoint``, the stored and older shapes
are still read, and ``plot_curves`` writes a PNG."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agentjet.apps.demo import DemoResult, save_plot
from agentjet.apps.research.monitor import TrialResult, read_eval_record
from agentjet.apps.research.report import trial_curve
from agentjet.apps.research.state import StudyState, TrialRecord
from agentjet.client import driver, scheduled
from agentjet.observe.bench_records import BenchRecord, load_history
from agentjet.observe.curveplot import Line, Panel, plot_curves
from agentjet.observe.learncurve import EvalPoint, LearnCurve, curve_from_demo, demo_eval

ROOT = Path(__file__).resolve().parents[2]


def test_the_driver_and_the_scheduled_client_take_the_one_record() -> None:
    assert driver.EvalPoint is EvalPoint and scheduled.EvalPoint is EvalPoint


def test_every_former_shape_reads_into_the_one_record() -> None:
    # a demo result's evals (the driver's dump plus wall minutes), and an early one without clocks
    e = EvalPoint(train_steps=3, policy_version=3, reward=0.5, episodes=8, train_seconds=60.0, seconds=90.0)
    assert demo_eval({**e.model_dump(), "minutes": 1.5}) == e
    early = demo_eval({"train_steps": 2, "reward": 0.4, "minutes": 2.0})
    assert (early.train_seconds, early.seconds, early.policy_version) == (None, 120.0, None)
    # ajet research's result.json, before the driver too
    assert isinstance(read_eval_record(e.model_dump()), EvalPoint)
    old = read_eval_record({"policy_version": 3, "train_steps": 3, "reward": 0.6, "episodes": 4, "failed": 1,
                            "seconds": 2.5})
    assert type(old) is EvalPoint and old.eval_seconds == 2.5 and old.episodes == 3
    assert all(type(p) is EvalPoint for p in TrialResult(stop_reason="x", evals=[e.model_dump()]).evals)
    # a study's points: EvalPoints, kept in study.json as step and value as before
    stored = [{"step": 0, "value": 0.1}, {"step": 2, "value": 0.3}]
    t = TrialRecord(id="r", config_id="c", seed=0, params={}, points=stored)
    assert all(type(p) is EvalPoint for p in t.points) and t.add_point(4, 0.5) and not t.add_point(4, 0.6)
    assert [(p.train_steps, p.policy_version, p.reward) for p in trial_curve(t).points] == \
        [(0, 0, 0.1), (2, 2, 0.3), (4, 4, 0.5)]
    state = StudyState(digest="d", created_at=0.0, trials=[t])
    assert json.loads(state.model_dump_json())["trials"][0]["points"] == [*stored, {"step": 4, "value": 0.5}]
    assert StudyState.model_validate_json(state.model_dump_json()) == state
    # a demo result -> a bench curve
    curve = curve_from_demo({"settings": {"task": "addition"}, "evals": [e.model_dump()]})
    assert curve.points == [e]


def test_a_curve_is_stored_in_the_shape_the_bench_page_reads_and_old_history_still_loads() -> None:
    curve = LearnCurve(task="addition", points=[EvalPoint(train_steps=0, policy_version=0, reward=0.2),
                                                EvalPoint(train_steps=4, reward=0.8, train_seconds=None, seconds=300.0)])
    stored = json.loads(curve.model_dump_json())["points"]
    assert stored == [{"steps": 0, "reward": 0.2, "train_minutes": 0.0, "minutes": 0.0},
                      {"steps": 4, "reward": 0.8, "train_minutes": None, "minutes": 5.0}]
    again = LearnCurve.model_validate_json(curve.model_dump_json())
    assert [(p.train_steps, p.reward, p.train_minutes, p.minutes) for p in again.points] == \
        [(0, 0.2, 0.0, 0.0), (4, 0.8, None, 5.0)]
    history = load_history(ROOT / "benchmarks" / "bench_history.jsonl")  # written before the one record
    curves = [c for r in history for c in r.curves.values()]
    assert curves and all(type(p) is EvalPoint for c in curves for p in c.points)
    line = (ROOT / "benchmarks" / "bench_history.jsonl").read_text().splitlines()[-1]
    rec = BenchRecord.model_validate_json(line)
    for task, c in json.loads(line)["curves"].items():
        dumped = json.loads(rec.model_dump_json())["curves"][task]["points"]
        assert [set(p) for p in dumped] == [set(p) for p in c["points"]]
        assert [p["steps"] for p in dumped] == [p["steps"] for p in c["points"]]


def test_plot_curves_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    curve = LearnCurve(task="addition", target=0.75, points=[
        EvalPoint(train_steps=s, policy_version=s, reward=r, train_seconds=30.0 * s, seconds=40.0 * s)
        for s, r in [(0, 0.2), (2, 0.5), (4, 0.8)]])
    panels = [Panel([Line(curve, label="run")], x="steps", target=0.75, target_label="target"),
              Panel([Line(curve, x="minutes", style={"linestyle": "--"}), Line(xy=[(0.0, 0.1), (1.0, 0.4)], label="pairs")],
                    x="train_minutes", title="by minutes", ylim=(0, 1.02), legend="best")]
    path = tmp_path / "sub" / "curves.png"
    assert plot_curves(panels, path, "two panels", cols=2, figsize=(8, 3))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    assert plot_curves(Panel([Line(curve, label="run")]), tmp_path / "one.png", "one panel")
    assert not plot_curves([], tmp_path / "none.png")
    with pytest.raises(ValueError, match="axis"):
        plot_curves(Panel([Line(curve)], x="hours"), tmp_path / "bad.png")


def test_the_demo_plot_draws_through_plot_curves(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    evals = [EvalPoint(train_steps=s, policy_version=s, reward=r, train_seconds=30.0 * s, seconds=40.0 * s)
             for s, r in [(0, 0.2), (2, 0.6)]]
    result = DemoResult(eval_before=0.2, eval_after=0.6, train_steps=2, policy_version=2, train_episodes=32,
                        failed_episodes=0, seconds=120.0, reward_by_version={1: 0.3, 2: 0.5},
                        settings={"model": "m", "task": "addition"}, evals=evals,
                        steps=[{"minutes": 0.5, "train_steps": 1, "reward_mean": 0.3}])
    saved = json.loads(json.dumps(result.to_json()))  # demo_result.json: each eval's fields and its wall minutes
    assert saved["evals"] == [{**e.model_dump(), "minutes": e.seconds / 60} for e in evals]
    assert curve_from_demo(saved).points == evals  # what the bench reads back
    assert result.curve().points == evals
    assert save_plot(result, tmp_path / "reward_curve.png")
    assert (tmp_path / "reward_curve.png").stat().st_size > 5000


def test_the_demo_keeps_and_draws_a_cocktails_eval_per_task_type(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from agentjet.apps.demo import by_type
    from agentjet.client.runner import ReplyTrace

    done = [({"task_type": "a"}, ReplyTrace(1.0)), ({"task_type": "b"}, ReplyTrace(0.0)),
            ({"task_type": "a"}, ReplyTrace(0.0)), ({}, ReplyTrace(0.5))]
    assert by_type(done) == ({"a": 0.5, "b": 0.0, "task": 0.5}, {"a": 2, "b": 1, "task": 1})
    evals = [EvalPoint(train_steps=s, policy_version=s, reward=r, seconds=60.0 * s) for s, r in [(0, 0.2), (2, 0.6)]]
    rows = [{"minutes": 0.0, "train_steps": 0, "rewards": {"a": 0.1, "b": 0.3}, "episodes": {"a": 2, "b": 2}},
            {"minutes": 2.0, "train_steps": 2, "rewards": {"a": 0.5, "b": 0.7}, "episodes": {"a": 2, "b": 2}}]
    result = DemoResult(eval_before=0.2, eval_after=0.6, train_steps=2, policy_version=2, train_episodes=32,
                        failed_episodes=0, seconds=120.0, reward_by_version={1: 0.3, 2: 0.5},
                        settings={"model": "m", "task": "rg:a+b"}, evals=evals, eval_by_type=rows)
    assert json.loads(json.dumps(result.to_json()))["eval_by_type"] == rows
    drawn: list[Any] = []
    from agentjet.apps import demo

    def plot(panels: list[Any], path: Path, **kw: Any) -> bool:
        drawn.extend(panels)
        return real(panels, path, **kw)

    real = demo.plot_curves
    monkeypatch.setattr(demo, "plot_curves", plot)
    assert save_plot(result, tmp_path / "reward_curve.png")
    per_type = drawn[-1]
    assert [line.label for line in per_type.lines] == ["a (held-out)", "b (held-out)"]
    assert [list(line.xy) for line in per_type.lines] == [[(0.0, 0.1), (2.0, 0.5)], [(0.0, 0.3), (2.0, 0.7)]]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"{name}_curves", ROOT / "benchmarks" / "learning" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_benchmark_scripts_read_their_result_files_into_the_one_record(tmp_path: Path) -> None:
    """vs_trl.json and objectives.json keep their dict-shaped points (the files are not rewritten); each script
    reads them into a curve of EvalPoints, and its figure is drawn by plot_curves."""
    vs_trl = _script("vs_trl")
    data = json.loads((ROOT / "benchmarks" / "results" / "vs_trl.json").read_text())
    for run in data["runs"]:
        curve = vs_trl.run_curve(run, data["base_eval"])
        assert all(type(p) is EvalPoint for p in curve.points) and curve.points[0].reward == data["base_eval"]
        assert [(p.train_steps, p.reward) for p in curve.points[1:]] == [(p["step"], p["eval"]) for p in run["points"]]
        old = next((p["train_s"] / 60 for p in run["points"] if p["eval"] >= vs_trl.TARGET), None)  # the old rule
        assert vs_trl._time_to(run, vs_trl.TARGET) == pytest.approx(old)
    objectives = _script("objectives")
    saved = json.loads((ROOT / "benchmarks" / "results" / "objectives.json").read_text())
    for run in saved["runs"]:
        curve = objectives.run_curve(run)
        assert [(p.train_steps, p.policy_version, p.reward) for p in curve.points] == \
            [(e["train_steps"], e["policy_version"], e["reward"]) for e in run["evals"]]
        row = objectives.eval_row(curve.points[-1], [0.0, run["budget_min"]])
        assert set(row) == set(run["evals"][-1]) and row["reward"] == run["evals"][-1]["reward"]
    pytest.importorskip("matplotlib")
    vs_trl.plot(data["runs"], data["base_eval"], tmp_path / "vs_trl.png", "vs TRL")
    objectives.plot(saved["runs"], saved["summary"], tmp_path / "objectives.png", "objectives")
    assert (tmp_path / "vs_trl.png").stat().st_size > 10_000 and (tmp_path / "objectives.png").stat().st_size > 10_000


def test_an_ablation_resumes_from_its_results_file_only_when_it_measured_the_same_thing(tmp_path: Path) -> None:
    """``vs_trl.py --resume``: the runs already in --out are kept (a 2-hour screen spans sessions); a file of
    another model, budget or eval size is refused rather than mixed in."""
    import argparse

    vs_trl = _script("vs_trl")
    out = tmp_path / "screen.json"
    args = argparse.Namespace(out=out, model="smollm2-135m-instruct", budget_min=15.0, eval_n=44)
    assert vs_trl._resumed(args) == ([], None)  # nothing yet: start over
    runs = [{"side": "agentjet", "arm": "as-is", "seed": 0, "points": []}]
    out.write_text(json.dumps({"model": args.model, "budget_min": 15.0, "eval_n": 44, "runs": runs,
                               "base_eval": 0.273}))
    assert vs_trl._resumed(args) == (runs, 0.273)
    with pytest.raises(SystemExit, match="15.0 min.*this run asks for .* 8.0 min"):
        vs_trl._resumed(argparse.Namespace(**{**vars(args), "budget_min": 8.0}))


def test_a_results_file_names_the_commit_its_job_began_at_not_one_its_own_writes_made_dirty(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``vs_trl.save`` runs after every run of a long job and rewrites a tracked results file: a commit read there
    would be ``-dirty`` from the second write on. The file keeps the commit the job began at."""
    import argparse

    pytest.importorskip("matplotlib")
    vs_trl = _script("vs_trl")
    monkeypatch.setattr(vs_trl, "git_commit", lambda root: "abc1234-dirty")  # what a read now would say
    data = json.loads((ROOT / "benchmarks" / "results" / "vs_trl.json").read_text())
    runs = [r for r in data["runs"] if r["side"] == "agentjet"]
    out = tmp_path / "ablation.json"
    args = argparse.Namespace(out=out, model="smollm2-135m-instruct", task="addition", budget_min=data["budget_min"],
                              seeds=[0], eval_n=44, target=0.75, shared=data["shared"], sides=["agentjet"],
                              arms=["as-is"], score_levels=0)
    minutes = [float(m) for m in data["eval_points_min"]]
    vs_trl.save(args, runs, minutes, data["base_eval"], complete=False, commit="abc1234")
    assert json.loads(out.read_text())["commit"] == "abc1234"


def test_the_holding_checks_read_issue_38s_three_rules_off_the_runs() -> None:
    """``vs_trl.holding_checks``: the time to 0.75 against half TRL's (a seed that never reaches it counts the
    budget), the mean eval at every point from minute 5 against TRL's, and each AgentJet seed's largest fall
    below its best so far (a drawdown, not the last point against the best)."""
    vs_trl = _script("vs_trl")
    minutes = [1, 5, 10, 15]

    def run(side: str, seed: int, evals: list[float]) -> dict[str, Any]:
        return {"side": side, "seed": seed, "points": [{"train_s": m * 60.0, "step": i + 1, "target_min": m,
                                                        "eval": e} for i, (m, e) in enumerate(zip(minutes, evals, strict=True))]}

    # AgentJet reaches 0.75 at minute 1 on both seeds; TRL at 5 and never (15): ratio 1 / 10
    aj = [run("agentjet", 0, [0.8, 0.95, 0.88, 0.95]), run("agentjet", 1, [0.8, 0.9, 0.9, 0.9])]
    trl = [run("trl", 0, [0.5, 0.8, 0.85, 0.9]), run("trl", 1, [0.5, 0.6, 0.7, 0.7])]
    checks = vs_trl.holding_checks(aj + trl, minutes, budget_min=15)
    assert checks["time_to_target_ratio"] == pytest.approx(1 / 10) and checks["time_to_target_ok"]
    assert list(checks["late_points"]) == ["5", "10", "15"] and checks["late_points_ok"]
    # seed 0 fell 0.07 below its best at minute 10 and came back: the drawdown counts, so the check fails
    assert checks["fall_from_best_by_seed"] == pytest.approx([0.07, 0.0]) and not checks["fall_ok"]
    assert not checks["all_ok"]
    # TRL ahead at one late point fails the second check, whatever the others say
    trl[1]["points"][3]["eval"] = 1.0
    assert not vs_trl.holding_checks(aj + trl, minutes, budget_min=15)["late_points_ok"]
    # one side alone (the ablation), or unmatched seeds: no checks
    assert vs_trl.holding_checks(aj, minutes, budget_min=15) is None
    assert vs_trl.holding_checks(aj + trl[:1], minutes, budget_min=15) is None


def test_each_results_file_names_its_task_and_the_levels_file_says_levels(tmp_path: Path) -> None:
    """``vs_trl.py --task``: the default file of another task names it, a run with the levels arm has ``levels`` in
    its name, and ``--resume`` refuses a file of another task (a file from before ``--task`` measured addition)."""
    import argparse

    vs_trl = _script("vs_trl")
    assert vs_trl.default_out("addition", ["as-is"], ["agentjet", "trl"]).name == "vs_trl.json"  # as before
    rg = vs_trl.default_out("rg:chain_sum:level=0", ["as-is"], ["agentjet", "trl"]).name
    assert rg == "vs_trl_chain_sum_level_0.json"
    assert "levels" in vs_trl.default_out("addition", ["as-is", "levels"], ["agentjet"]).name
    assert (vs_trl.target_for("addition"), vs_trl.target_for("rg:products")) == (0.75, 0.5)
    out = tmp_path / "old.json"
    out.write_text(json.dumps({"model": "m", "budget_min": 15.0, "eval_n": 44, "runs": [], "base_eval": 0.2}))
    args = argparse.Namespace(out=out, model="m", budget_min=15.0, eval_n=44, task="addition")
    assert vs_trl._resumed(args) == ([], 0.2)
    with pytest.raises(SystemExit, match="on addition; this run asks for .* on rg:gcd"):
        vs_trl._resumed(argparse.Namespace(**{**vars(args), "task": "rg:gcd"}))


def test_the_checks_give_each_late_point_its_standard_error_and_say_when_a_margin_is_inside_it() -> None:
    vs_trl = _script("vs_trl")
    minutes = [5, 10]

    def run(side: str, seed: int, evals: list[float]) -> dict[str, Any]:
        return {"side": side, "seed": seed, "points": [{"train_s": m * 60.0, "step": i + 1, "target_min": m,
                                                        "eval": e} for i, (m, e) in enumerate(zip(minutes, evals, strict=True))]}

    aj = [run("agentjet", s, e) for s, e in enumerate([[0.6, 0.9], [0.5, 0.7], [0.7, 0.8]])]
    trl = [run("trl", s, e) for s, e in enumerate([[0.1, 0.7], [0.2, 0.8], [0.3, 0.75]])]
    late = vs_trl.holding_checks(aj + trl, minutes, budget_min=10, target=0.5)["late_points"]
    assert late["5"]["se_agentjet"] == pytest.approx(0.1 / 3**0.5) and late["5"]["margin"] == pytest.approx(0.4)
    assert not late["5"]["inside_se"]  # 0.4 apart, standard errors of 0.058 each
    assert late["10"]["ok"] and late["10"]["inside_se"]  # 0.8 vs 0.75: ahead as measured, inside the noise
    assert vs_trl.standard_error([1.0]) is None


def test_the_level_figures_read_the_uniform_share_and_steps_after_minute_5_off_the_counters() -> None:
    vs_trl = _script("vs_trl")

    def run(seed: int, at5: tuple[int, int, int], end: tuple[int, int, int], highest: int,
            final: dict[str, float]) -> dict[str, Any]:
        steps, uniform, done = at5
        return {"seed": seed, "points": [
                    {"train_s": 60.0, "eval": 0.5, "train_steps": 1, "uniform": 0, "done": 8},
                    {"train_s": 300.0, "eval": 0.9, "train_steps": steps, "uniform": uniform, "done": done},
                    {"train_s": 600.0, "eval": 0.82, "train_steps": end[0], "uniform": end[1], "done": end[2]}],
                "end": dict(zip(("train_steps", "uniform", "done"), end, strict=True)),
                "levels": {"highest": {"addition": highest}}, "final_by_level": final}

    figures = vs_trl.level_figures([run(0, (10, 100, 200), (20, 150, 400), 2, {"1": 0.5, "2": 0.25}),
                                    run(1, (12, 50, 100), (18, 110, 200), 1, {"1": 0.7, "2": 0.05})])
    assert figures["uniform_share_after_5_by_seed"] == pytest.approx([50 / 200, 60 / 100])
    assert figures["steps_after_5_by_seed"] == [10, 6] and figures["steps_after_5"] == 8
    assert figures["fall_from_best_by_seed"] == pytest.approx([0.08, 0.08])  # 0.9 at minute 5, 0.82 at 10
    assert figures["highest_level_by_seed"] == [2, 1]
    assert figures["final_by_level"] == pytest.approx({"1": 0.6, "2": 0.15})
    assert vs_trl.level_figures([{"seed": 0, "points": []}])["uniform_share_after_5"] is None  # TRL: no counters


def test_rule_b_says_levels_win_only_when_all_four_clauses_hold_and_each_can_fail_alone() -> None:
    """Issue 51's rule (b), as docs/benchmarks.md writes it: signal, steps, no forgetting, progress."""
    vs_trl = _script("vs_trl")

    def arm(uniform: float, steps: float, falls: list[float], late: float, highest: list[int],
            final: dict[str, float]) -> dict[str, Any]:
        return {"uniform_share_after_5": uniform, "steps_after_5": steps, "fall_from_best_by_seed": falls,
                "late_mean_eval": late, "highest_level_by_seed": highest, "final_by_level": final}

    runs = [{"side": "agentjet:levels", "levels": {"ladders": {"addition": {"start": 0, "top": 4}}}}]
    as_is = arm(0.8, 10, [0.0, 0.02, 0.0], 0.95, [None] * 3, {"1": 0.5, "2": 0.3})
    winning = arm(0.4, 16, [0.05, 0.0, 0.01], 0.93, [2, 3, 2], {"1": 0.8, "2": 0.36})
    checks = vs_trl.levels_checks({"agentjet": as_is, "agentjet:levels": winning}, runs)
    assert checks["win"] and checks["progress"]["level"] == 2 and checks["steps"]["ratio"] == pytest.approx(1.6)
    for clause, change in [("signal", {"uniform_share_after_5": 0.5}),  # not under 0.50
                           ("steps", {"steps_after_5": 14}),  # 1.4x
                           ("no_forgetting", {"fall_from_best_by_seed": [0.07, 0.0, 0.0]}),
                           ("no_forgetting", {"late_mean_eval": 0.91}),  # 0.04 under as-is's
                           ("progress", {"final_by_level": {"1": 0.8, "2": 0.34}}),  # 0.04 over as-is's at 2
                           ("progress", {"highest_level_by_seed": [0, 3, 2]})]:  # a seed never rose
        checks = vs_trl.levels_checks({"agentjet": as_is, "agentjet:levels": {**winning, **change}}, runs)
        assert not checks[clause]["ok"] and not checks["win"], change
        assert all(checks[k]["ok"] for k in ("signal", "steps", "no_forgetting", "progress") if k != clause)
    unscored = vs_trl.levels_checks({"agentjet": as_is, "agentjet:levels": {**winning, "highest_level_by_seed":
                                                                            [3, 3, 4]}}, runs)
    assert not unscored["progress"]["ok"] and "not scored" in unscored["progress"]["why"]
    assert vs_trl.levels_checks({"agentjet": as_is}, runs) is None  # one arm: no verdict
