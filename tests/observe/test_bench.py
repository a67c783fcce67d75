"""`ajet bench`: history, the baseline runs, the gate set by their noise (a learning regression fails, a repeat of
the baseline passes), learning curves read from every demo format, the backfill's flag detection, the report."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from rich.console import Console

from agentjet.apps.bench.report import baseline_runs, gate, record_from_demo, render_report
from agentjet.apps.bench.suite import (
    TOY_MIN_STEPS,
    BenchOptions,
    LearnSettings,
    SuiteSettings,
    learn_demo,
    run_bench,
    run_learn,
    toy_settings,
)
from agentjet.observe.bench_records import (
    Baseline,
    BaselineRef,
    BenchMetric,
    BenchRecord,
    load_baseline,
    load_history,
)
from agentjet.observe.learncurve import (
    LearnCurve,
    curve_from_demo,
    decline_after_target,
    eval_at_step,
    steps_to_target,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def record(commit: str = "abc1234", speedup: float = 4.0, latency: float = 10.0, raw: float = 100.0,
           date: str = "2025-01-01T00:00:00Z") -> BenchRecord:
    return BenchRecord(commit=commit, date=date, machine="test", device="cpu", mode="quick", seconds=1.0, metrics={
        "speedup": BenchMetric(value=speedup, unit="x"),
        "latency": BenchMetric(value=latency, unit="ms", higher_is_better=False),
        "raw": BenchMetric(value=raw, gated=False)})


def by_name(results: list) -> dict:
    return {r.name: r for r in results}


def test_gate_fails_beyond_two_standard_deviations_of_the_baseline_runs() -> None:
    rule = Baseline()
    base = [record(speedup=s, latency=lat) for s, lat in ((4.0, 10.0), (4.2, 11.0), (3.8, 9.0))]  # std 0.2, 1.0
    ok = by_name(gate(record(speedup=3.65, latency=11.9, raw=1.0), base, rule))
    assert ok["speedup"].mean == pytest.approx(4.0) and ok["speedup"].std == pytest.approx(0.2)
    assert ok["speedup"].limit == pytest.approx(3.6) and not ok["speedup"].regressed  # 1.75 std worse: noise
    assert ok["latency"].limit == pytest.approx(12.0) and not ok["latency"].regressed  # lower is better
    assert "raw" not in ok  # not gated
    bad = by_name(gate(record(speedup=3.55, latency=12.1), base, rule))
    assert bad["speedup"].regressed and bad["latency"].regressed
    assert not any(r.regressed for r in gate(record(speedup=9.0, latency=1.0), base, rule))  # better is fine
    assert gate(record(), [], rule) == []


def test_identical_baseline_runs_gate_by_the_floor_and_a_missing_figure_fails() -> None:
    rule = Baseline(std_floor=0.02)
    same = [record(speedup=5.0)] * 3  # a deterministic figure: std 0
    r = by_name(gate(record(speedup=4.85), same, rule))["speedup"]
    assert r.std == 0 and r.spread == pytest.approx(0.1) and r.limit == pytest.approx(4.8) and not r.regressed
    assert by_name(gate(record(speedup=4.75), same, rule))["speedup"].regressed
    missing = record()
    del missing.metrics["speedup"]
    assert by_name(gate(missing, same, rule))["speedup"].regressed  # a figure every baseline run has
    partial = [record(), record(), record().model_copy(update={"metrics": {"latency": BenchMetric(value=10.0)}})]
    assert "speedup" not in by_name(gate(record(), partial, rule))  # not every baseline run has it: not gated


# ---------------------------------------------------------------------------------------------- learning records
def demo_result(commit: str, rewards: list[float], steps: list[int], minutes_per_eval: float = 1.0,
                seed: int = 0, lr: float = 2e-5) -> dict[str, Any]:
    """A demo_result.json as today's demo writes it: evals every ``minutes_per_eval`` training minutes."""
    evals = [{"seconds": 60 * i * minutes_per_eval * 1.2, "train_seconds": 60 * i * minutes_per_eval,
              "train_steps": s, "policy_version": s, "reward": r, "episodes": 44, "eval_seconds": 10.0}
             for i, (r, s) in enumerate(zip(rewards, steps, strict=True))]
    return {"eval_before": rewards[0], "eval_after": rewards[-1], "train_steps": steps[-1], "seconds": 400.0,
            "evals": evals, "settings": {"task": "addition", "seed": str(seed), "learning_rate": lr},
            "provenance": {"commit": commit, "machine": "test", "device": "cpu"}}


BASE_CURVES = [  # three seeds of the baseline version: eval at evals 1 training minute apart, and the steps there
    ([0.27, 0.45, 0.70, 0.84, 0.88, 0.91], [0, 1, 3, 4, 6, 7]),
    ([0.27, 0.50, 0.66, 0.80, 0.86, 0.89], [0, 1, 2, 4, 5, 7]),
    ([0.27, 0.41, 0.73, 0.86, 0.90, 0.90], [0, 2, 3, 5, 6, 8]),
]


def learn_history() -> list[BenchRecord]:
    return [record_from_demo(demo_result("base", r, s, seed=i), date=f"d{i}") for i, (r, s) in enumerate(BASE_CURVES)]


def test_the_learning_gate_catches_lr_over_100_and_passes_a_repeat_and_a_slower_machine() -> None:
    rule = Baseline(modes={"learn": BaselineRef(commit="base")})
    history = learn_history()
    runs = baseline_runs(history, rule, "learn")
    assert len(runs) == 3
    repeat = record_from_demo(demo_result("next", [0.27, 0.47, 0.69, 0.83, 0.88, 0.90], [0, 1, 3, 4, 6, 7]))
    results = by_name(gate(repeat, runs, rule))
    assert set(results) == {"learn/addition/steps_to_target", "learn/addition/eval_at_step_2",
                            "learn/addition/eval_at_step_4",  # minutes and the final eval are recorded, not gated
                            "learn/addition/decline_after_target"}  # an absolute bound, not the baseline's
    assert not any(r.regressed for r in results.values())
    # the same steps on a machine twice as slow (evals 2 training minutes apart): more minutes than any baseline
    # run, yet the step figures pass
    slow = record_from_demo(demo_result("slow", [0.27, 0.55, 0.84, 0.89], [0, 2, 4, 7], minutes_per_eval=2.0))
    assert slow.metrics["learn/addition/train_minutes_to_target"].value > \
        1.25 * max(r.metrics["learn/addition/train_minutes_to_target"].value for r in runs)
    assert not any(r.regressed for r in gate(slow, runs, rule))
    # the learning rate / 100: the curve barely moves, the target is never reached
    flat = record_from_demo(demo_result("lr100", [0.27, 0.27, 0.30, 0.27, 0.32, 0.30], [0, 1, 3, 4, 6, 7], lr=2e-7))
    failed = by_name(gate(flat, runs, rule))
    assert failed["learn/addition/steps_to_target"].regressed and failed["learn/addition/steps_to_target"].value is None
    assert failed["learn/addition/eval_at_step_4"].regressed and failed["learn/addition/eval_at_step_2"].regressed


def test_a_late_decline_fails_the_gate_with_or_without_a_baseline() -> None:
    """Learning that holds (issue 38): the eval may not end more than 0.06 below its best since it reached 0.75."""
    holds = record_from_demo(demo_result("holds", [0.27, 0.6, 0.8, 0.93, 0.9, 0.91], [0, 1, 3, 4, 6, 7]))
    slides = record_from_demo(demo_result("slides", [0.27, 0.6, 0.8, 0.98, 0.93, 0.89], [0, 1, 3, 4, 6, 7]))
    never = record_from_demo(demo_result("never", [0.27, 0.4, 0.5, 0.45], [0, 1, 3, 4]))
    name = "learn/addition/decline_after_target"
    assert holds.metrics[name].value == pytest.approx(0.02) and slides.metrics[name].value == pytest.approx(0.09)
    assert name not in never.metrics and decline_after_target(curve_from_demo(
        demo_result("never", [0.27, 0.4, 0.5, 0.45], [0, 1, 3, 4]))) is None
    no_baseline = Baseline()
    assert [(g.name, g.regressed, g.limit) for g in gate(holds, [], no_baseline)] == [(name, False, 0.06)]
    assert [(g.name, g.regressed) for g in gate(slides, [], no_baseline)] == [(name, True)]
    rule = Baseline(modes={"learn": BaselineRef(commit="base")})
    assert by_name(gate(slides, baseline_runs(learn_history(), rule, "learn"), rule))[name].regressed


def test_steps_to_target_and_eval_at_step_interpolate_between_evals() -> None:
    curve = curve_from_demo(demo_result("c", [0.27, 0.5, 0.7, 0.8, 0.9], [0, 2, 3, 5, 6]))
    assert curve.target == 0.75 and len(curve.points) == 5
    assert steps_to_target(curve) == pytest.approx(4.0)  # 0.7 at 3 -> 0.8 at 5: 0.75 halfway
    assert eval_at_step(curve, 4) == pytest.approx(0.75) and eval_at_step(curve, 2) == pytest.approx(0.5)
    assert eval_at_step(curve, 7) is None  # past the last eval
    repeated = LearnCurve(task="addition", target=0.75, points=[
        *curve.points[:2], curve.points[1].model_copy(update={"reward": 0.6}), *curve.points[2:]])
    assert eval_at_step(repeated, 2) == pytest.approx(0.6)  # two evals at one step: the later one
    assert steps_to_target(curve.model_copy(update={"target": 0.2})) == 0.0  # there from the start


def test_the_converter_reads_every_recorded_demo_format() -> None:
    """The demo JSONs in benchmarks/results: the first demo (before/after only, no provenance), the scheduled
    client's (periodic evals; provenance under `recorded`), today's (provenance, the server's settings)."""
    first = json.loads((RESULTS / "demo.json").read_text())
    with pytest.raises(ValueError, match="commit"):
        record_from_demo(first)
    rec = record_from_demo(first, commit="84c508c", machine="m", backfilled=True)
    [curve] = rec.curves.values()
    assert [(p.train_steps, p.reward) for p in curve.points] == [(0, first["eval_before"]),
                                                                 (first["train_steps"], first["eval_after"])]
    assert curve.points[-1].train_minutes is None and curve.points[-1].minutes == pytest.approx(first["seconds"] / 60)
    assert not rec.metrics["learn/addition/steps_to_target"].gated  # a straight line between two evals
    assert rec.backfilled and "before and after only" in rec.notes

    loaded = json.loads((RESULTS / "demo_scheduled_loaded.json").read_text())
    rec = record_from_demo(loaded)
    assert rec.commit == loaded["recorded"]["commit"] and rec.machine == loaded["recorded"]["machine"]
    [curve] = rec.curves.values()
    assert [p.train_steps for p in curve.points] == [e["train_steps"] for e in loaded["evals"]]
    assert [p.train_minutes for p in curve.points] == pytest.approx([e["train_seconds"] / 60 for e in loaded["evals"]])
    first_up = next(i for i, e in enumerate(loaded["evals"]) if e["reward"] >= 0.75)
    lo, hi = loaded["evals"][first_up - 1], loaded["evals"][first_up]
    expect = lo["train_steps"] + (0.75 - lo["reward"]) / (hi["reward"] - lo["reward"]) * (hi["train_steps"] -
                                                                                           lo["train_steps"])
    assert rec.metrics["learn/addition/steps_to_target"].value == pytest.approx(expect)
    assert rec.metrics["learn/addition/steps_to_target"].gated

    today = json.loads((RESULTS / "lookup_seed0.json").read_text())
    rec = record_from_demo(today)
    assert set(rec.curves) == {"lookup"} and rec.commit == today["provenance"]["commit"]
    assert rec.settings["server"]["loss"]["objective"]  # the loss config travels with the record
    assert rec.metrics["learn/lookup/final_eval"].value == today["eval_after"]
    # the history round-trips it: the curve's points in their stored shape (steps, reward, minutes)
    again = BenchRecord.model_validate_json(rec.model_dump_json())
    assert again.model_dump(exclude={"curves"}) == rec.model_dump(exclude={"curves"})
    for task, curve in rec.curves.items():
        assert again.curves[task].model_dump(exclude={"points"}) == curve.model_dump(exclude={"points"})
        assert [(p.train_steps, p.reward) for p in again.curves[task].points] == \
            [(p.train_steps, p.reward) for p in curve.points]
        assert [p.train_minutes for p in again.curves[task].points] == \
            pytest.approx([p.train_minutes for p in curve.points])


def load_backfill() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_backfill", ROOT / "benchmarks" / "learning" / "bench_backfill.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_backfill_keeps_the_flags_an_old_demo_has_and_says_which_it_lacked() -> None:
    from agentjet.apps.bench.suite import demo_flags

    backfill = load_backfill()
    old_help = ("Options:\n  --model TEXT\n  --task TEXT\n  --steps INTEGER\n  --lr FLOAT\n  --out-dir PATH\n"
                "  --time-budget-s FLOAT  stop training after this many seconds\n  --eval-tasks INTEGER\n")
    settings = LearnSettings(demo=learn_demo(seed=1))
    used, missing = backfill.supported(demo_flags(settings), old_help)
    assert used == {"--model": "smollm2-135m-instruct", "--task": "addition", "--time-budget-s": "300",
                    "--steps": "1000"}
    assert missing == ["--seed", "--eval-every-s", "--no-early-stop"]
    data = json.loads((RESULTS / "demo.json").read_text())
    rec = backfill.backfill_record(data, "84c508c", settings, used, missing, "a test")
    assert rec.backfilled and rec.mode == "learn" and rec.commit == "84c508c"
    assert "--seed, --eval-every-s, --no-early-stop" in rec.notes and "--time-budget-s 300" in rec.notes
    assert rec.settings["bench"]["flags_missing"] == missing and rec.settings["bench"]["seed"] == 1


# ---------------------------------------------------------------------------------------------- run_bench
def test_run_bench_sets_a_baseline_of_three_runs_and_fails_on_an_injected_regression(tmp_path: Path) -> None:
    opts = BenchOptions(history=tmp_path / "h.jsonl", baseline=tmp_path / "b.json", report_dir=tmp_path / "report")
    values = iter([4.0, 4.2, 3.8, 3.9])

    def fake_suite(s: SuiteSettings, console: Console) -> BenchRecord:
        return record(speedup=next(values))

    console = Console(record=True, width=200)
    assert run_bench(replace(opts, set_baseline=True, repeat=3), console, fake_suite) == 0
    assert load_baseline(opts.baseline).modes["quick"].commit == "abc1234"
    assert run_bench(opts, console, fake_suite) == 0  # 3.9: within 2 std (0.2) of 4.0
    assert len(load_history(opts.history)) == 4
    assert run_bench(replace(opts, compare_only=True, inject={"speedup": 0.85}), console, fake_suite) == 1
    assert "REGRESSION" in console.export_text()
    assert len(load_history(opts.history)) == 4  # an injected run is not recorded
    assert run_bench(replace(opts, compare_only=True, inject={"nope": 0.5}), console, fake_suite) == 2
    assert (tmp_path / "report" / "bench_history.html").read_text().count("<tr><td><code>abc1234") == 4


def test_run_bench_learn_mode_runs_seeds_in_a_row_and_gates_a_learning_regression(tmp_path: Path) -> None:
    opts = BenchOptions(history=tmp_path / "h.jsonl", baseline=tmp_path / "b.json", report_dir=tmp_path / "report",
                        learn=LearnSettings(demo=learn_demo(seed=0)))
    seen: list[LearnSettings] = []

    def fake_learn(s: LearnSettings, console: Console) -> BenchRecord:
        seen.append(s)
        if s.demo.learning_rate is not None:  # the injected regression
            return record_from_demo(demo_result("base", [0.27, 0.3, 0.28, 0.31], [0, 2, 4, 6], seed=s.demo.seed),
                                    date="lr100")
        rewards, steps = BASE_CURVES[s.demo.seed % 3]
        return record_from_demo(demo_result("base", rewards, steps, seed=s.demo.seed), date=f"seed{s.demo.seed}")

    console = Console(record=True, width=200)
    assert run_bench(replace(opts, set_baseline=True, repeat=3), console, learn=fake_learn) == 0
    assert [s.demo.seed for s in seen] == [0, 1, 2]
    assert [r.mode for r in load_history(opts.history)] == ["learn"] * 3
    assert run_bench(replace(opts, record=False), console, learn=fake_learn) == 0  # seed 0 again: a repeat
    lowered = replace(opts, record=False, learn=LearnSettings(demo=learn_demo(seed=0, learning_rate=2e-7)))
    assert run_bench(lowered, console, learn=fake_learn) == 1
    assert "learn/addition/steps_to_target missing" in console.export_text()
    assert (tmp_path / "report" / "bench_learning.png").stat().st_size > 5000
    again = replace(opts, report_only=True, report_dir=tmp_path / "docs")  # what regenerates docs/bench/
    assert run_bench(again, console, learn=lambda s, c: pytest.fail("--report-only runs nothing")) == 0
    assert (tmp_path / "docs" / "bench_history.html").read_text().count("data-commit='base'") == 3


def test_the_report_overlays_three_versions(tmp_path: Path) -> None:
    history = learn_history() + [
        record_from_demo(demo_result("v2", [0.27, 0.6, 0.8, 0.9], [0, 2, 4, 6])),
        record_from_demo(json.loads((RESULTS / "demo.json").read_text()), commit="v1-first", backfilled=True),
        record_from_demo(demo_result("lr100", [0.27, 0.28, 0.3, 0.29], [0, 2, 4, 6]))]
    out = render_report(history, tmp_path, Baseline(modes={"learn": BaselineRef(commit="base")}))
    assert Path(out["bench_learning"]).stat().st_size > 10000
    page = Path(out["html"]).read_text()
    assert page.count("data-commit='base'") == 3 and "data-commit='v2'" in page and "data-commit='v1-first'" in page
    rows = {row.split("'")[1]: row for row in page.split("<tr data-commit=")[1:]}  # the last row per commit
    assert "baseline (3 runs)" in rows["base"] and "nothing comparable" in rows["v1-first"]  # two evals only
    assert "fails: eval_at_step_2, eval_at_step_4, steps_to_target" in rows["lr100"]
    assert "4 versions with learning curves" in page and "learn: commit <code>base</code>, 3 runs" in page


# ---------------------------------------------------------------------------------------------- real runs
@pytest.mark.server
def test_seeded_toy_run_on_the_tiny_model_learns_and_lr_over_100_fails_the_gate(tiny_model_path: Path) -> None:
    """One seeded run of the quick suite's learning check (the demo, the toy task, fixed steps) and the same run with
    the learning rate / 100: the first is the baseline (one run: the floor's spread), the second fails the gate."""
    toy = toy_settings(str(tiny_model_path))
    base = run_learn(toy, Console(quiet=True), mode="quick")
    before, after = base.metrics["learn/toy/eval_before"].value, base.metrics["learn/toy/final_eval"].value
    assert base.metrics["learn/toy/train_steps"].value >= TOY_MIN_STEPS  # (a step may slip past 14 before the stop)
    assert after > before + 0.2, (before, after)  # it learned
    from agentjet.tasks import toy as toy_task

    lowered = toy.demo.model_copy(update={"learning_rate": toy_task.RECOMMENDED.learning_rate / 100})
    low = run_learn(replace(toy, demo=lowered), Console(quiet=True),
                    mode="quick")
    assert low.settings["learning_rate"] == pytest.approx(toy_task.RECOMMENDED.learning_rate / 100)
    results = by_name(gate(low, [base], Baseline()))
    assert results["learn/toy/final_eval"].regressed, (low.metrics["learn/toy/final_eval"].value, after)
    assert not any(r.regressed for r in gate(base, [base], Baseline()))


def test_ajet_bench_quick_runs_and_gates(tmp_path: Path) -> None:
    """The real quick suite, as CI runs it, then the gate on its record: clean and with an injected regression."""
    args = [sys.executable, "-m", "agentjet.cli", "bench", "--quick", "--history", str(tmp_path / "h.jsonl"),
            "--baseline", str(tmp_path / "b.json"), "--report-dir", str(tmp_path / "report")]
    try:
        run = subprocess.run([*args, "--set-baseline"], capture_output=True, text=True, timeout=400)
    except subprocess.TimeoutExpired as exc:  # say where it stalled: the suite and the demo print their progress
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        logs = [Path(p) for p in re.findall(r"(/\S+/server\.log)", out) if Path(p).exists()]
        server_log = logs[-1].read_text(errors="replace")[-6000:] if logs else "(no server log left)"
        pytest.fail(f"ajet bench --quick did not finish in 400 s; its output:\n{out[-4000:]}\n"
                    f"the demo server's log:\n{server_log}")
    assert run.returncode == 0, run.stdout + run.stderr
    [rec] = load_history(tmp_path / "h.jsonl")
    assert rec.mode == "quick" and rec.metrics["learn/toy/train_steps"].value >= TOY_MIN_STEPS
    assert rec.metrics["learn/toy/final_eval"].gated and set(rec.curves) == {"toy"}
    assert not {"learn/reward_first", "learn/reward_last", "learn/steps"} & set(rec.metrics)
    assert rec.metrics["merge/token_ratio"].value > 2 and rec.metrics["engine/batch8_speedup"].value > 0
    ok = subprocess.run([*args, "--compare-only"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([*args, "--compare-only", "--inject-regression", "learn/toy/final_eval=0.5"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "REGRESSION" in bad.stdout
    assert json.loads((tmp_path / "b.json").read_text())["modes"]["quick"]["commit"] == rec.commit
