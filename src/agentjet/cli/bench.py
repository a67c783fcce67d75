"""``ajet bench``: the version-by-version benchmark suite (``agentjet.apps.bench.suite``, ``docs/dashboard.md``,
the gate in ``docs/benchmarks.md``)."""

from __future__ import annotations

from pathlib import Path

import typer

from agentjet.cli.common import console, fail, require_server_extra
from agentjet.tasks import DEFAULT_TASK


def bench(
    quick: bool = typer.Option(False, "--quick", help="the tiny model, short measurements (under a minute)"),
    learn: bool = typer.Option(False, "--learn", help="the learning suite: the demo on SmolLM2, a fixed seed and "
                               "training budget, evals at fixed training-clock points (about 7 min a run)"),
    task: str = typer.Option(DEFAULT_TASK, help="--learn: the demo task (a built-in one, or rg:NAME, a "
                             "reasoning-gym dataset: docs/environments.md)"),
    seed: int = typer.Option(0, min=0, help="--learn: the demo's seed (with --repeat: seed, seed + 1, ...)"),
    budget_min: float | None = typer.Option(None, min=0.1, help="--learn: training minutes per run (default: the "
                                            "bench's)"),
    learning_rate: float | None = typer.Option(None, "--lr", min=0.0, help="--learn: the learning rate (default: "
                                               "the task's; lower it to see the gate catch a learning regression)"),
    repeat: int = typer.Option(1, min=1, max=20, help="runs in a row, each recorded (a baseline wants 3)"),
    history: Path = typer.Option(Path("benchmarks/bench_history.jsonl"), help="history file (JSON lines)"),
    baseline: Path = typer.Option(Path("benchmarks/bench_baseline.json"), help="baseline file"),
    sigmas: float | None = typer.Option(None, min=0.1, help="fail beyond this many standard deviations of the "
                                        "baseline runs (default: the baseline file's, 2)"),
    set_baseline: bool = typer.Option(False, help="make this run's commit the baseline of its mode (its runs in "
                                      "the history are the baseline runs)"),
    record: bool = typer.Option(True, help="append the runs to the history"),
    compare_only: bool = typer.Option(False, help="re-check the latest history run of this mode; run nothing"),
    report_only: bool = typer.Option(False, help="render the report from the history (e.g. --report-dir "
                                     "docs/bench); run and compare nothing"),
    inject_regression: list[str] = typer.Option([], help="metric=factor: scale a measured value before the "
                                                "comparison (to test the gate; the run is not recorded)"),
    report_dir: Path | None = typer.Option(Path("runs/bench"), help="where bench_history.html/.png and "
                                           "bench_learning.png go"),
    model: str | None = typer.Option(None, help="model for the engine and learning parts"),
    commit: str | None = typer.Option(None, help="record under this commit (default: git HEAD of the cwd)"),
) -> None:
    """Run the benchmark suite, record it by commit, gate it by the baseline runs' noise; exit 1 on a regression."""
    if not (compare_only or report_only):  # these read the history only
        require_server_extra("bench")
    from agentjet.apps.bench.suite import BenchOptions, LearnSettings, SuiteSettings, learn_demo, run_bench
    from agentjet.tasks import TaskError, get_task

    inject: dict[str, float] = {}
    for item in inject_regression:
        name, sep, factor = item.partition("=")
        try:
            inject[name] = float(factor)
        except ValueError:
            sep = ""
        if not sep:
            fail(f"--inject-regression {item!r} must look like metric=0.5")
    if quick and learn:
        fail("--quick and --learn are separate modes: pick one")
    if learn:
        try:
            get_task(task)
        except TaskError as exc:
            fail(f"--task: {exc}")
    learn_settings = None
    budget = {"time_budget_s": 60 * budget_min} if budget_min is not None else {}
    if learn:
        learn_settings = LearnSettings(demo=learn_demo(task=task, seed=seed, learning_rate=learning_rate,
                                                       **({"model": model} if model else {}),
                                                       run=budget), commit=commit)
    code = run_bench(BenchOptions(quick=quick, learn=learn_settings, repeat=repeat, history=history,
                                  baseline=baseline, sigmas=sigmas, set_baseline=set_baseline, record=record,
                                  compare_only=compare_only, report_only=report_only, inject=inject or None,
                                  report_dir=report_dir,
                                  suite=SuiteSettings(quick=quick, model=model, commit=commit)), console)
    raise typer.Exit(code)
