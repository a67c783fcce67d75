"""The bench history's records: one JSON line per ``ajet bench`` run (figures keyed by commit, date and machine),
and the baseline (which commit's runs are the reference). The data model and its files only: the suite that
measures, the gate and the report are ``agentjet.apps.bench``; the dashboard's Bench page reads these files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentjet.observe.learncurve import LearnCurve

Mode = Literal["quick", "full", "learn"]
MODES: tuple[str, ...] = ("quick", "full", "learn")


class BenchMetric(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: float
    unit: str = ""
    higher_is_better: bool = True
    gated: bool = True  # compared with the baseline; False: recorded and plotted only
    max_value: float | None = None  # an absolute bound: the run fails above it, with or without a baseline
    note: str = ""


class BenchRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    commit: str
    date: str  # ISO 8601, UTC
    machine: str
    device: str
    mode: Mode
    seconds: float
    metrics: dict[str, BenchMetric]
    notes: str = ""
    curves: dict[str, LearnCurve] = Field(default_factory=dict)  # task -> held-out eval curve (learn and quick)
    settings: dict[str, Any] = Field(default_factory=dict)  # the run's settings as recorded (the loss config too)
    backfilled: bool = False  # run later from the commit's own code (benchmarks/learning/bench_backfill.py); see notes


class BaselineRef(BaseModel):
    """One mode's baseline: the history records of ``commit`` in that mode (only those dated in ``dates``
    when it is not empty)."""

    model_config = ConfigDict(extra="forbid")
    commit: str
    dates: list[str] = Field(default_factory=list)


class Baseline(BaseModel):
    """``benchmarks/bench_baseline.json``: which runs are the baseline per mode, and the gate's rule."""

    model_config = ConfigDict(extra="forbid")
    sigmas: float = Field(2.0, gt=0, description="a figure fails beyond this many standard deviations")
    std_floor: float = Field(0.02, ge=0, lt=1, description="the standard deviation used is at least this share "
                             "of |mean| (k identical runs would otherwise make the gate infinitely strict)")
    min_runs: int = Field(3, ge=1, description="baseline runs the rule asks for; fewer are used with a warning")
    modes: dict[str, BaselineRef] = Field(default_factory=dict)


class GateResult(BaseModel):
    name: str
    value: float | None  # None: the candidate lacks the figure
    mean: float
    std: float  # sample standard deviation of the baseline values (0 for one run)
    spread: float  # max(std, std_floor x |mean|)
    limit: float  # the worst value that passes
    k: int  # baseline runs with this figure (0: an absolute bound, BenchMetric.max_value)
    regressed: bool

    @property
    def sigmas_off(self) -> float:
        """How many spreads the value sits from the mean, signed so that negative is worse."""
        return float("-inf") if self.value is None else 0.0 if self.spread == 0 else (
            (self.value - self.mean) / self.spread * (1 if self.limit <= self.mean else -1))


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
