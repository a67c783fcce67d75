"""Version-by-version performance tracking for ``ajet bench``: the history file (one JSON record per run,
keyed by commit, date and machine), the stored baseline, the regression check and the HTML / PNG report.

The suite that produces the numbers is ``agentjet.bench_suite`` (it starts servers and engines, so it sits on a
higher floor than this room). Gated metrics are ratios measured within one run (machine-independent enough to
compare across runs); absolute rates are recorded and plotted but not gated.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_THRESHOLD = 0.05


class BenchMetric(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: float
    unit: str = ""
    higher_is_better: bool = True
    gated: bool = True  # compared with the baseline; False: recorded and plotted only
    note: str = ""


class BenchRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    commit: str
    date: str  # ISO 8601, UTC
    machine: str
    device: str
    mode: Literal["quick", "full"]
    seconds: float
    metrics: dict[str, BenchMetric]
    notes: str = ""


class Baseline(BaseModel):
    """The reference values per mode (``ajet bench --set-baseline`` writes the current run's gated metrics)."""

    model_config = ConfigDict(extra="forbid")
    threshold: float = Field(DEFAULT_THRESHOLD, gt=0, lt=1)
    runs: dict[str, BenchRecord] = Field(default_factory=dict)  # mode -> the record used as baseline


class Comparison(BaseModel):
    name: str
    baseline: float
    value: float
    change: float  # relative, signed so that negative is worse
    regressed: bool


def load_history(path: Path) -> list[BenchRecord]:
    if not path.exists():
        return []
    records = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(BenchRecord.model_validate_json(line))
            except ValueError as exc:
                raise ValueError(f"{path}:{n}: not a bench record: {exc}") from exc
    return records


def append_history(path: Path, record: BenchRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(record.model_dump_json() + "\n")


def load_baseline(path: Path) -> Baseline:
    return Baseline.model_validate_json(path.read_text()) if path.exists() else Baseline()


def save_baseline(path: Path, baseline: Baseline) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(baseline.model_dump_json(indent=2) + "\n")


def compare(record: BenchRecord, baseline: BenchRecord | None, threshold: float) -> list[Comparison]:
    """Each gated metric against the baseline's value: a regression is a change worse than ``threshold``."""
    if baseline is None:
        return []
    out = []
    for name, m in sorted(record.metrics.items()):
        ref = baseline.metrics.get(name)
        if not m.gated or ref is None or not math.isfinite(ref.value) or ref.value == 0:
            continue
        change = (m.value - ref.value) / abs(ref.value)
        if not m.higher_is_better:
            change = -change
        out.append(Comparison(name=name, baseline=ref.value, value=m.value, change=change,
                              regressed=change < -threshold))
    return out


# ---------------------------------------------------------------------------------------------- report
def render_png(records: list[BenchRecord], path: Path, baseline: Baseline | None = None) -> bool:
    """One panel per metric over the runs (oldest first), the baseline as a dashed line. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = sorted({n for r in records for n in r.metrics})
    if not names:
        return False
    cols = 3
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for mode, marker in (("quick", "o"), ("full", "s")):
            pts = [(i, r.metrics[name].value) for i, r in enumerate(records) if r.mode == mode and name in r.metrics]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=mode)
            ref = baseline.runs.get(mode) if baseline else None
            if ref is not None and name in ref.metrics:
                ax.axhline(ref.metrics[name].value, linestyle="--", linewidth=0.8, color="grey")
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


def render_html(records: list[BenchRecord], path: Path, baseline: Baseline | None = None,
                png_name: str | None = None) -> None:
    """A self-contained page: the plot (when rendered) and a table of every run and metric."""
    names = sorted({n for r in records for n in r.metrics})
    esc = html.escape
    head = "".join(f"<th>{esc(n)}</th>" for n in names)
    body = []
    for r in reversed(records):
        cells = "".join(f"<td>{r.metrics[n].value:.4g}</td>" if n in r.metrics else "<td></td>" for n in names)
        body.append(f"<tr><td><code>{esc(r.commit[:10])}</code></td><td>{esc(r.date)}</td><td>{esc(r.machine)}"
                    f"</td><td>{esc(r.mode)}</td>{cells}</tr>")
    base = ""
    if baseline and baseline.runs:
        items = "".join(f"<li>{esc(mode)}: commit <code>{esc(b.commit[:10])}</code> ({esc(b.date)})</li>"
                        for mode, b in sorted(baseline.runs.items()))
        base = f"<p>Baseline (threshold {baseline.threshold:.0%}):</p><ul>{items}</ul>"
    img = f'<img src="{esc(png_name)}" alt="bench history" style="max-width:100%">' if png_name else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>AgentJet bench history</title>"
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}</style></head><body>"
        f"<h1>AgentJet bench history</h1><p>{len(records)} runs.</p>{base}{img}"
        f"<table><tr><th>commit</th><th>date</th><th>machine</th><th>mode</th>{head}</tr>{''.join(body)}</table>"
        "</body></html>\n")


def render_report(records: list[BenchRecord], out_dir: Path, baseline: Baseline | None = None) -> dict[str, str]:
    png = out_dir / "bench_history.png"
    page = out_dir / "bench_history.html"
    drew = render_png(records, png, baseline)
    render_html(records, page, baseline, png.name if drew else None)
    return {"html": str(page), **({"png": str(png)} if drew else {})}


def summary_json(comparisons: list[Comparison]) -> str:
    return json.dumps([c.model_dump() for c in comparisons], indent=2)
