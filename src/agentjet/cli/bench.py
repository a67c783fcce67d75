"""``ajet bench``: the version-by-version benchmark suite (``agentjet.bench_suite``, ``docs/dashboard.md``)."""

from __future__ import annotations

from pathlib import Path

import typer

from agentjet.cli.common import console, fail


def bench(
    quick: bool = typer.Option(False, "--quick", help="the tiny model, short measurements (under a minute)"),
    history: Path = typer.Option(Path("benchmarks/bench_history.jsonl"), help="history file (JSON lines)"),
    baseline: Path = typer.Option(Path("benchmarks/bench_baseline.json"), help="baseline file"),
    threshold: float | None = typer.Option(None, help="regression threshold (default: the baseline's, 0.05)"),
    set_baseline: bool = typer.Option(False, help="make this run the baseline for its mode"),
    record: bool = typer.Option(True, help="append this run to the history"),
    compare_only: bool = typer.Option(False, help="re-check the latest history run of this mode; run nothing"),
    inject_regression: list[str] = typer.Option([], help="metric=factor: scale a measured value before the "
                                                "comparison (to test the gate; the run is not recorded)"),
    report_dir: Path | None = typer.Option(Path("runs/bench"), help="where bench_history.html/.png go"),
    model: str | None = typer.Option(None, help="model for the engine and learning parts"),
    commit: str | None = typer.Option(None, help="record under this commit (default: git HEAD of the cwd)"),
) -> None:
    """Run the benchmark suite, record it by commit, compare with the baseline; exit 1 on a regression."""
    from agentjet.bench_suite import BenchOptions, SuiteSettings, run_bench

    inject: dict[str, float] = {}
    for item in inject_regression:
        name, sep, factor = item.partition("=")
        try:
            inject[name] = float(factor)
        except ValueError:
            sep = ""
        if not sep:
            fail(f"--inject-regression {item!r} must look like metric=0.5")
    if threshold is not None and not 0 < threshold < 1:
        fail("--threshold must be between 0 and 1 (e.g. 0.05)")
    code = run_bench(BenchOptions(quick=quick, history=history, baseline=baseline, threshold=threshold,
                                  set_baseline=set_baseline, record=record, compare_only=compare_only,
                                  inject=inject or None, report_dir=report_dir,
                                  suite=SuiteSettings(quick=quick, model=model, commit=commit)), console)
    raise typer.Exit(code)
