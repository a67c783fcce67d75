"""`ajet bench`: history, baseline, the regression gate (with an injected regression) and the report."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from agentjet.bench_suite import BenchOptions, SuiteSettings, run_bench
from agentjet.observe.bench import BenchMetric, BenchRecord, compare, load_baseline, load_history


def record(speedup: float = 4.0, latency: float = 10.0, raw: float = 100.0) -> BenchRecord:
    return BenchRecord(commit="abc1234", date="2025-01-01T00:00:00Z", machine="test", device="cpu", mode="quick",
                       seconds=1.0, metrics={
                           "speedup": BenchMetric(value=speedup, unit="x"),
                           "latency": BenchMetric(value=latency, unit="ms", higher_is_better=False),
                           "raw": BenchMetric(value=raw, gated=False)})


def test_compare_applies_the_threshold_in_the_right_direction() -> None:
    base = record()
    assert not any(c.regressed for c in compare(record(speedup=3.85), base, 0.05))  # -3.75%: within 5%
    worse = {c.name: c for c in compare(record(speedup=3.7, latency=10.6, raw=1.0), base, 0.05)}
    assert worse["speedup"].regressed and worse["latency"].regressed  # -7.5%, +6% latency
    assert "raw" not in worse  # not gated
    better = {c.name: c for c in compare(record(speedup=5.0, latency=5.0), base, 0.05)}
    assert not better["speedup"].regressed and better["latency"].change > 0
    assert compare(record(), None, 0.05) == []


def test_run_bench_records_sets_baseline_and_fails_on_an_injected_regression(tmp_path: Path) -> None:
    opts = BenchOptions(history=tmp_path / "h.jsonl", baseline=tmp_path / "b.json", report_dir=tmp_path / "report")
    suite_calls = []

    def fake_suite(s: SuiteSettings, console: Console) -> BenchRecord:
        suite_calls.append(s)
        return record()

    console = Console(record=True, width=160)
    assert run_bench(BenchOptions(**{**opts.__dict__, "set_baseline": True}), console, fake_suite) == 0
    assert load_baseline(opts.baseline).runs["quick"].metrics["speedup"].value == 4.0
    assert run_bench(opts, console, fake_suite) == 0
    assert len(load_history(opts.history)) == 2
    injected = BenchOptions(**{**opts.__dict__, "inject": {"speedup": 0.5}})
    assert run_bench(injected, console, fake_suite) == 1
    assert "REGRESSION" in console.export_text()
    assert len(load_history(opts.history)) == 2  # an injected run is not recorded
    assert (tmp_path / "report" / "bench_history.html").read_text().count("<tr><td><code>abc1234") == 2
    assert (tmp_path / "report" / "bench_history.png").stat().st_size > 5000
    assert run_bench(BenchOptions(**{**opts.__dict__, "inject": {"nope": 0.5}}), console, fake_suite) == 2


def test_ajet_bench_quick_runs_and_gates(tmp_path: Path) -> None:
    """The real quick suite, as CI runs it, then the gate on its record: clean and with an injected regression."""
    args = [sys.executable, "-m", "agentjet.cli", "bench", "--quick", "--history", str(tmp_path / "h.jsonl"),
            "--baseline", str(tmp_path / "b.json"), "--report-dir", str(tmp_path / "report")]
    t0 = time.monotonic()
    run = subprocess.run([*args, "--set-baseline"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert time.monotonic() - t0 < 180
    [rec] = load_history(tmp_path / "h.jsonl")
    assert rec.mode == "quick" and rec.metrics["learn/steps"].value >= 1
    assert rec.metrics["merge/token_ratio"].value > 2 and rec.metrics["engine/batch8_speedup"].value > 0
    ok = subprocess.run([*args, "--compare-only"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([*args, "--compare-only", "--inject-regression", "merge/token_ratio=0.9"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "REGRESSION" in bad.stdout
    assert json.loads((tmp_path / "b.json").read_text())["threshold"] == 0.05
