"""Version-by-version performance tracking for ``ajet bench``: which history records form the baseline, the gate
set by the baseline runs' noise, the figures read off a demo's learning curve, and the HTML / PNG report. The
records and their files (the history, one JSON record per run; the baseline) are ``agentjet.observe.bench_records``.

The suite that produces the numbers is ``agentjet.apps.bench.suite`` (it starts servers and engines, so it sits on a
higher floor than this room); learning curves and the figures taken from them are ``agentjet.observe.learncurve``.

The gate (docs/benchmarks.md, "The bench gate"): the baseline is k >= ``Baseline.min_runs`` runs of one commit in
one mode; per gated figure their mean and sample standard deviation. A later run fails where its figure is worse
than the mean by more than ``sigmas`` x max(std, ``std_floor`` x |mean|): the floor keeps k identical runs (a
deterministic figure) from making the gate infinitely strict. A figure every baseline run has but the candidate
lacks (a learning target not reached) fails too. A figure with an absolute bound (``BenchMetric.max_value``: a
task's ``max_decline``, learning that holds) fails above it, with or without a baseline.
"""

from __future__ import annotations

import html
import math
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentjet.observe.bench_records import (
    MODES,
    Baseline,
    BenchMetric,
    BenchRecord,
    GateResult,
    Mode,
)
from agentjet.observe.curveplot import Line, Panel, plot_curves
from agentjet.observe.learncurve import (
    LearnCurve,
    curve_from_demo,
    decline_after_target,
    eval_at_step,
    spec_for,
    steps_to_target,
    train_minutes_to_target,
)


def baseline_runs(history: list[BenchRecord], baseline: Baseline, mode: str,
                  like: BenchRecord | None = None) -> list[BenchRecord]:
    """The history records that form ``mode``'s baseline (empty when none is set); with ``like``, only those on
    the same learning tasks (a ``--task lookup`` run is gated by the baseline's lookup runs)."""
    ref = baseline.modes.get(mode)
    if ref is None:
        return []
    return [r for r in history if r.mode == mode and r.commit == ref.commit and (not ref.dates or r.date in ref.dates)
            and (like is None or set(r.curves) == set(like.curves))]


def gate(record: BenchRecord, runs: list[BenchRecord], baseline: Baseline) -> list[GateResult]:
    """Each figure gated in every baseline run, against their mean and spread (see the module docstring); and
    each figure of the record with an absolute bound (``max_value``), against it, with or without a baseline."""
    bounded = [GateResult(name=n, value=m.value, mean=m.max_value, std=0.0, spread=0.0, limit=m.max_value, k=0,
                          regressed=not m.value <= m.max_value)
               for n, m in sorted(record.metrics.items()) if m.max_value is not None]
    return bounded + _against_baseline(record, runs, baseline) if runs else bounded


def _against_baseline(record: BenchRecord, runs: list[BenchRecord], baseline: Baseline) -> list[GateResult]:
    names = sorted({n for r in runs for n, m in r.metrics.items() if m.gated})
    out = []
    for name in names:
        values = [r.metrics[name].value for r in runs if name in r.metrics and r.metrics[name].gated]
        if len(values) < len(runs) or not all(math.isfinite(v) for v in values):
            continue  # not every baseline run has it (a target some runs missed): not gated
        higher = runs[0].metrics[name].higher_is_better
        mean = statistics.fmean(values)
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        spread = max(std, baseline.std_floor * abs(mean))
        limit = mean - baseline.sigmas * spread if higher else mean + baseline.sigmas * spread
        m = record.metrics.get(name)
        if m is not None and not m.gated:
            continue  # the run marks its own figure as not comparable (a two-eval curve's straight-line guess)
        value = m.value if m is not None and math.isfinite(m.value) else None
        regressed = value is None or (value < limit if higher else value > limit)
        out.append(GateResult(name=name, value=value, mean=mean, std=std, spread=spread, limit=limit, k=len(values),
                              regressed=regressed))
    return out


# ---------------------------------------------------------------------------------------------- learning records
def learn_figures(curve: LearnCurve) -> dict[str, BenchMetric]:
    """The figures of one task's curve (``agentjet.observe.learncurve``): steps to the target and eval at fixed
    steps are gated (step counts move less with the machine's load than minutes do); minutes are recorded only."""
    spec = spec_for(curve.task)
    p = f"learn/{curve.task}/"
    last = curve.points[-1]
    # a curve of two evals (before and after: the first demos) makes the interpolated figures a straight-line
    # guess: recorded, not gated
    coarse = len(curve.points) <= 2
    how = "interpolated between evals" if not coarse else "a straight line between the two evals: not gated"
    out = {
        p + "eval_before": BenchMetric(value=curve.points[0].reward, gated=False, note="held-out eval at step 0"),
        p + "final_eval": BenchMetric(value=last.reward, gated=spec.final_gated,
                                      note=f"held-out eval at the end ({last.train_steps} steps)"),
        p + "train_steps": BenchMetric(value=last.train_steps, unit="steps", gated=False, note="train steps in the budget"),
    }
    if last.train_minutes:
        out[p + "steps_per_train_minute"] = BenchMetric(value=last.train_steps / last.train_minutes, unit="steps/min",
                                                        gated=False)
    if curve.target is not None:
        steps = steps_to_target(curve)
        if steps is not None:
            out[p + "steps_to_target"] = BenchMetric(value=steps, unit="steps", higher_is_better=False, gated=not coarse,
                                                     note=f"train steps to held-out eval {curve.target:g} ({how})")
        minutes = train_minutes_to_target(curve)
        if minutes is not None:
            out[p + "train_minutes_to_target"] = BenchMetric(
                value=minutes, unit="min", higher_is_better=False, gated=False,
                note=f"training minutes to held-out eval {curve.target:g} (recorded, not gated)")
    decline = decline_after_target(curve)
    if decline is not None and not coarse:
        out[p + "decline_after_target"] = BenchMetric(
            value=decline, higher_is_better=False, gated=False, max_value=spec.max_decline,
            note=f"best held-out eval since it reached {curve.target:g} minus the final one (learning that holds"
                 + (f"; at most {spec.max_decline:g}, whatever the baseline)" if spec.max_decline is not None
                    else "; recorded)"))
    for s in spec.at_steps:
        value = eval_at_step(curve, s)
        if value is not None:
            out[p + f"eval_at_step_{s}"] = BenchMetric(value=value, gated=not coarse,
                                                       note=f"held-out eval at {s} train steps ({how})")
    return out


def record_from_demo(data: dict[str, Any], *, mode: Mode = "learn", commit: str | None = None,
                     machine: str | None = None, device: str | None = None, date: str | None = None,
                     backfilled: bool = False, notes: str = "") -> BenchRecord:
    """A history record from a demo result (``demo_result.json`` as a dict, any version's format): its eval curve,
    the figures read off it, and its settings. Missing provenance (the first demos recorded none) comes from the
    arguments."""
    curve = curve_from_demo(data)
    prov = {**(data.get("recorded") or {}), **(data.get("provenance") or {})}
    commit = commit or prov.get("commit") or data.get("commit")
    if not commit:
        raise ValueError("the demo result records no commit: pass commit=")
    return BenchRecord(
        commit=str(commit), date=date or str(prov.get("date") or "unknown"),
        machine=machine or str(prov.get("machine") or data.get("machine") or "unknown"),
        device=device or str(prov.get("device") or "cpu"), mode=mode, seconds=float(data.get("seconds", 0.0)),
        metrics=learn_figures(curve), curves={curve.task: curve}, settings=dict(data.get("settings") or {}),
        backfilled=backfilled, notes="; ".join(n for n in (notes, f"curve: {curve.source}") if n))


# ---------------------------------------------------------------------------------------------- report
def versions(records: list[BenchRecord]) -> list[str]:
    """The commits with learning curves, in the order they first appear in the history."""
    seen: dict[str, None] = {}
    for r in records:
        if r.curves:
            seen.setdefault(r.commit, None)
    return list(seen)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def render_png(records: list[BenchRecord], path: Path, baseline: Baseline | None = None) -> bool:
    """One panel per metric over the runs (oldest first), the baseline's mean as a dashed line. False without
    matplotlib."""
    plt = _pyplot()
    names = sorted({n for r in records for n in r.metrics})
    if plt is None or not names:
        return False
    history = records
    cols = 3
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for mode, marker in zip(MODES, ("o", "s", "^"), strict=True):
            pts = [(i, r.metrics[name].value) for i, r in enumerate(records) if r.mode == mode and name in r.metrics]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=mode)
            runs = baseline_runs(history, baseline, mode) if baseline else []
            ref = [r.metrics[name].value for r in runs if name in r.metrics]
            if ref:
                ax.axhline(statistics.fmean(ref), linestyle="--", linewidth=0.8, color="grey")
        unit = next((r.metrics[name].unit for r in records if name in r.metrics), "")
        ax.set_title(f"{name}" + (f" ({unit})" if unit else ""), fontsize=9)
        ax.set_xticks(range(len(records)))
        ax.set_xticklabels([r.commit[:7] for r in records], rotation=60, fontsize=6)
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777", "#4b5563",
          "#65a30d")  # the dashboard's palette (static/common.js)


def render_learning_png(records: list[BenchRecord], path: Path) -> bool:
    """The learning curves overlaid, one colour per version: per task, held-out eval against train steps and
    against training minutes (wall minutes, dashed, where a demo recorded no training clock). False without
    matplotlib or curves."""
    tasks = sorted({t for r in records for t in r.curves})
    if not tasks:
        return False
    colour = {c: COLORS[i % len(COLORS)] for i, c in enumerate(versions(records))}
    panels: list[Panel] = []
    for task in tasks:
        by_step: list[Line] = []
        by_min: list[Line] = []
        labelled: set[str] = set()
        target = None
        for r in records:
            curve = r.curves.get(task)
            if curve is None:
                continue
            label = None if r.commit in labelled else f"{r.commit[:7]}" + (" (backfilled)" if r.backfilled else "")
            labelled.add(r.commit)
            kw = {"color": colour[r.commit], "alpha": 0.85, "linewidth": 1.4, "marker": "o", "markersize": 3}
            by_step.append(Line(curve, label=label, style=kw))
            if all(p.train_minutes is not None for p in curve.points):
                by_min.append(Line(curve, label=label, style=kw))
            else:
                by_min.append(Line(curve, x="minutes", label=label, style={**kw, "linestyle": "--"}))
            target = curve.target if curve.target is not None else target
        common = Panel([], ylabel="held-out eval", target=target, legend_fontsize=7, title_fontsize=10)
        panels += [replace(common, lines=by_step, x="steps", title=f"{task}: held-out eval vs train steps",
                           xlabel="train steps"),
                   replace(common, lines=by_min, x="train_minutes", xlabel="training minutes",
                           title=f"{task}: held-out eval vs training minutes (dashed: wall minutes)")]
    return plot_curves(panels, path, cols=2, figsize=(12, 4.2 * len(tasks)), dpi=100)


def _seed(r: BenchRecord) -> str:
    bench = r.settings.get("bench") or {}
    if "--seed" in bench.get("flags_missing", []):
        return "none (no --seed)"
    return str(bench.get("seed", r.settings.get("seed", "")))


def _verdict(r: BenchRecord, records: list[BenchRecord], baseline: Baseline | None) -> str:
    """The gate's verdict on a learning run against the learn baseline (as ``ajet bench`` would give it)."""
    if baseline is None:
        return ""
    runs = baseline_runs(records, baseline, r.mode, like=r)
    if not runs:
        return "no baseline"
    if any(b is r for b in runs):
        return f"baseline ({len(runs)} runs)"
    results = gate(r, runs, baseline)
    failed = [g.name.rsplit("/", 1)[-1] for g in results if g.regressed]
    return "fails: " + ", ".join(failed) if failed else "passes" if results else "nothing comparable"


def _learn_table(records: list[BenchRecord], baseline: Baseline | None = None) -> str:
    esc = html.escape
    rows = []
    for r in reversed([r for r in records if r.curves]):
        for task in sorted(r.curves):
            m = r.metrics
            p = f"learn/{task}/"
            cells = [m[p + k].value if p + k in m else None for k in
                     ("steps_to_target", "eval_at_step_4", "train_minutes_to_target", "final_eval", "train_steps")]
            missing = ["not reached", "", "not reached" if cells[0] is None else "no training clock", "", ""]
            text = "".join(f"<td>{v:.3g}</td>" if v is not None else f"<td>{missing[i]}</td>"
                           for i, v in enumerate(cells))
            rows.append(f"<tr data-commit='{esc(r.commit)}'><td><code>{esc(r.commit[:10])}</code></td>"
                        f"<td>{esc(r.date)}</td><td>{esc(r.mode)}</td><td>{esc(task)}</td><td>{esc(_seed(r))}</td>"
                        f"<td>{'yes' if r.backfilled else ''}</td>{text}"
                        f"<td>{esc(_verdict(r, records, baseline))}</td></tr>")
    if not rows:
        return ""
    head = ("<tr><th>commit</th><th>date</th><th>mode</th><th>task</th><th>seed</th><th>backfilled</th>"
            "<th>steps to target</th><th>eval at step 4</th><th>training min to target</th><th>final eval</th>"
            "<th>train steps</th><th>gate</th></tr>")
    return f"<h2>Learning runs</h2><table class='learn'>{head}{''.join(rows)}</table>"


def _baseline_html(records: list[BenchRecord], baseline: Baseline) -> str:
    esc = html.escape
    if not baseline.modes:
        return ""
    items = "".join(f"<li>{esc(mode)}: commit <code>{esc(ref.commit[:10])}</code>, "
                    f"{len(baseline_runs(records, baseline, mode))} runs</li>"
                    for mode, ref in sorted(baseline.modes.items()))
    return (f"<p>Baseline (a run fails where a gated figure is worse than the baseline runs' mean by more than "
            f"{baseline.sigmas:g} standard deviations, at least {baseline.std_floor:.0%} of the mean):</p>"
            f"<ul>{items}</ul>")


def render_html(records: list[BenchRecord], path: Path, baseline: Baseline | None = None,
                images: dict[str, str] | None = None) -> None:
    """A self-contained page: the learning overlay and the metric plot (when rendered), the learning runs, and a
    table of every run and metric."""
    names = sorted({n for r in records for n in r.metrics})
    esc = html.escape
    head = "".join(f"<th>{esc(n)}</th>" for n in names)
    body = []
    for r in reversed(records):
        cells = "".join(f"<td>{r.metrics[n].value:.4g}</td>" if n in r.metrics else "<td></td>" for n in names)
        body.append(f"<tr><td><code>{esc(r.commit[:10])}</code></td><td>{esc(r.date)}</td><td>{esc(r.machine)}"
                    f"</td><td>{esc(r.mode)}</td>{cells}</tr>")
    imgs = "".join(f'<h2>{esc(title)}</h2><img src="{esc(name)}" alt="{esc(title)}" style="max-width:100%">'
                   for title, name in (images or {}).items())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>AgentJet bench history</title>"
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}</style></head><body>"
        f"<h1>AgentJet bench history</h1><p>{len(records)} runs, {len(versions(records))} versions with learning "
        f"curves.</p>{_baseline_html(records, baseline) if baseline else ''}{imgs}{_learn_table(records, baseline)}"
        f"<h2>All runs</h2><table><tr><th>commit</th><th>date</th><th>machine</th><th>mode</th>{head}</tr>"
        f"{''.join(body)}</table></body></html>\n")


def render_report(records: list[BenchRecord], out_dir: Path, baseline: Baseline | None = None) -> dict[str, str]:
    """bench_learning.png (the overlay), bench_history.png (every metric over the runs) and bench_history.html."""
    learning = out_dir / "bench_learning.png"
    png = out_dir / "bench_history.png"
    page = out_dir / "bench_history.html"
    images = {}
    if render_learning_png(records, learning):
        images["Learning curves, one colour per version"] = learning.name
    if render_png(records, png, baseline):
        images["Every metric over the runs"] = png.name
    render_html(records, page, baseline, images)
    return {"html": str(page), **{p.stem: str(p) for p in (learning, png) if p.name in images.values()}}

