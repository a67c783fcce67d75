"""One study's results as its spec reads them: each run's metric, and per configuration the mean and spread over
its finished seeds. Written as ``results.tsv`` and ``results.json``; read by the report, the LLM planner and
a program of studies."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentjet.apps.research.spec import StudySpec
from agentjet.apps.research.state import StudyState, StudyStore, TrialRecord, TrialState, stored_point
from agentjet.files import write_atomic


def mean_spread(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (None with fewer than two values)."""
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


@dataclass(frozen=True)
class StudyResults:
    """A study's spec and its state, read together: what each run scored, and each configuration."""

    spec: StudySpec
    state: StudyState

    @classmethod
    def load(cls, spec: StudySpec, root: Path) -> StudyResults:
        """The results of the study on disk in ``root`` (read without taking its lock)."""
        store = StudyStore(root)
        if not store.exists():
            raise FileNotFoundError(f"no study in {root}")
        return cls(spec, store.load())

    def value(self, trial: TrialRecord) -> float | None:
        """The run's metric (its last or best eval point after step 0)."""
        return trial.value(self.spec.metric)

    def rows(self) -> list[dict[str, Any]]:
        """One row per run."""
        return [{"run": t.id, "config": t.config_id, "seed": t.seed, "state": t.state.value, "params": t.params,
                 "value": self.value(t), "last_step": t.last_step, "attempts": len(t.attempts),
                 "minutes": t.seconds / 60, "reason": t.reason, "points": [stored_point(p) for p in t.points]}
                for t in self.state.trials]

    def configs(self) -> list[dict[str, Any]]:
        """Per configuration: the mean and spread of the metric over its finished (done) seeds."""
        out = []
        for c in self.state.configs:
            runs = [t for t in self.state.trials if t.config_id == c.id]
            done = [v for t in runs if t.state is TrialState.DONE and (v := self.value(t)) is not None]
            partial = [v for t in runs if t.state is TrialState.PRUNED and (v := self.value(t)) is not None]
            mean, sd = mean_spread(done)
            out.append({"config": c.id, "params": c.params, "source": c.source, "why": c.why, "mean": mean,
                        "sd": sd, "n_done": len(done), "values": done, "pruned_values": partial,
                        "states": {s.value: sum(t.state is s for t in runs) for s in TrialState}})
        return out

    def write(self, root: Path) -> None:
        """``results.tsv`` (one row per run) and ``results.json`` (the rows and the configurations)."""
        rows = self.rows()
        names = list(self.spec.space)
        header = ["run", "config", "seed", "state", *names, "value", "last_step", "attempts", "minutes", "reason"]
        lines = ["\t".join(header)]
        for r in rows:
            cells = [r["run"], r["config"], r["seed"], r["state"], *[r["params"][n] for n in names],
                     "" if r["value"] is None else f"{r['value']:.4f}", "" if r["last_step"] is None else r["last_step"],
                     r["attempts"], f"{r['minutes']:.1f}", r["reason"].replace("\t", " ").replace("\n", " ")]
            lines.append("\t".join(str(c) for c in cells))
        write_atomic(root / "results.tsv", "\n".join(lines) + "\n")
        payload = {"question": self.spec.question, "metric": self.spec.metric.model_dump(mode="json"), "runs": rows,
                   "configs": self.configs()}
        write_atomic(root / "results.json", json.dumps(payload, indent=1))
