"""``report.md`` in the study directory: the question, what was tried and why, the results (mean and
spread over seeds), plots, the best configuration against the default, and the caveats (:class:`StudyReport`)."""

from __future__ import annotations

import math
import os
import platform
import re
import time
from pathlib import Path
from typing import Any

from agentjet.apps.research.results import StudyResults, mean_spread
from agentjet.apps.research.spec import Direction, Param, ParamType
from agentjet.apps.research.state import StudyState, TrialRecord, TrialState
from agentjet.observe.curveplot import Line, Panel, plot_curves
from agentjet.observe.learncurve import LearnCurve

STEP_PLOT = "metric_vs_step.png"


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if 1e-3 <= abs(value) < 1e4 or value == 0 else f"{value:.3g}"
    return str(value)


def _mean_sd(row: dict[str, Any]) -> str:
    if row["mean"] is None:
        return "–"
    sd = f" ± {row['sd']:.3f}" if row["sd"] is not None else ""
    return f"{row['mean']:.3f}{sd} (n={row['n_done']})"


def param_plot_name(name: str) -> str:
    return f"metric_vs_{re.sub(r'[^A-Za-z0-9]+', '_', name).strip('_')}.png"


def _ranked(rows: list[dict[str, Any]], direction: Direction) -> list[dict[str, Any]]:
    scored = [r for r in rows if r["mean"] is not None]
    return sorted(scored, key=lambda r: r["mean"], reverse=direction is Direction.MAXIMIZE)


def _eval_se(value: float, n: int) -> float:
    p = min(max(value, 0.0), 1.0)
    return math.sqrt(p * (1 - p) / n) if n > 0 else float("nan")


def compare(best: dict[str, Any], default: dict[str, Any], direction: Direction, eval_n: int,
            against: str = "the default") -> str:
    """How much one configuration beats another (the default), and whether that exceeds the noise."""
    delta = best["mean"] - default["mean"]
    if direction is Direction.MINIMIZE:
        delta = -delta
    rel = f" ({delta / abs(default['mean']) * 100:+.0f}%)" if default["mean"] else ""
    # noise per run: the seed spread, but never less than one eval's sampling error (two seeds say little)
    var = 0.0
    for r in (best, default):
        sd = max(r["sd"] or 0.0, _eval_se(r["mean"], eval_n))
        var += sd**2 / max(r["n_done"], 1)
    se = math.sqrt(var)
    verdict = ("more than twice its standard error" if delta > 2 * se
               else "within two standard errors: not distinguishable from noise at this many seeds")
    return (f"It beats {against} by {delta:+.3f}{rel}; the standard error of that difference (from the seed "
            f"spread, and at least one eval's sampling error) is about {se:.3f}, so the gap is {verdict}.")


def minutes_per_run(state: StudyState) -> dict[str, float]:
    """Mean wall minutes of each configuration's finished (done) runs."""
    out = {}
    for c in state.configs:
        done = [t.seconds / 60 for t in state.trials if t.config_id == c.id and t.state is TrialState.DONE]
        if done:
            out[c.id] = sum(done) / len(done)
    return out


def trial_curve(t: TrialRecord) -> LearnCurve:
    """A run's points (``study.json`` keeps them as step and value) as one curve of eval points."""
    return LearnCurve(task=t.id, points=list(t.points))


class _XAxis:
    """Where a parameter value goes on the x axis: numeric (log or linear) or categorical, nudged per
    configuration so configurations that share a value do not hide each other."""

    def __init__(self, p: Param, values: list[Any], n_configs: int) -> None:
        self.numeric = [float(c) for c in p.choices or [] if isinstance(c, int | float) and not isinstance(c, bool)]
        self.categorical = p.type is ParamType.CHOICE and len(self.numeric) != len(p.choices or [])
        nums = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        self.log = p.log or bool(self.numeric and min(self.numeric) > 0 and max(self.numeric) / min(self.numeric) >= 4)
        self.span = (max(nums) - min(nums)) if len(nums) > 1 and max(nums) > min(nums) else 1.0
        self.n = n_configs
        self.positions: dict[str, int] = {}

    def x(self, value: Any, config_index: int) -> float:
        shift = (config_index - (self.n - 1) / 2) * 0.04
        if self.categorical:
            return self.positions.setdefault(str(value), len(self.positions)) + shift
        if self.log:
            return float(value) * 10 ** (shift / 2)
        return float(value) + shift * self.span


class StudyReport:
    """The report of one study's results."""

    def __init__(self, results: StudyResults) -> None:
        self.results = results
        self.spec = results.spec
        self.state = results.state
        self.rows = results.configs()

    def eval_n(self) -> int:
        """Eval episodes per point, for the noise estimates."""
        from agentjet.apps.research.trial_client import eval_n_for

        try:
            return eval_n_for(self.spec.client)
        except (ValueError, KeyError):
            return self.spec.client.eval_n or 44

    def write(self, root: Path) -> Path:
        """``report.md`` and its plots in ``root``; the report's path."""
        spec, state, rows = self.spec, self.state, self.rows
        ranked = _ranked(rows, spec.metric.direction)
        plots = self.plots(root)
        eval_n = self.eval_n()
        lines: list[str] = [f"# {spec.question}", ""]
        budget = ", ".join(x for x in (f"{spec.budget.trials} runs" if spec.budget.trials else "",
                                       f"{spec.budget.minutes:g} minutes" if spec.budget.minutes else "") if x)
        es = spec.early_stop
        lines += [
            f"- **Metric**: {spec.metric.label()}, from the trial server's status API.",
            "- **Search space**: " + "; ".join(f"`{n}` {p.describe()}" for n, p in spec.space.items()) + ".",
            f"- **Runs**: {spec.seeds} seed(s) per configuration, up to {spec.parallel} at a time; budget {budget}.",
            f"- **Each run**: {spec.client.steps} train steps, a held-out eval every {spec.client.eval_every} steps "
            f"(and before training), task `{spec.client.task}`, at most {spec.client.time_budget_s / 60:.0f} min of "
            "training.",
            f"- **Planner**: {spec.planner.kind.value}" + (f" ({spec.planner.url})" if spec.planner.url else "") +
            (f"; early stopping: ASHA (reduction factor {es.reduction_factor}, first rung at step {spec.first_rung()}) "
             f"and only when more than {es.min_delta:g} behind the best run at that step" if es.enabled
             else "; no early stopping") + ".",
            f"- **Study time**: {state.elapsed_s / 60:.1f} min over {state.sessions} session(s); "
            f"{platform.machine()} with {os.cpu_count()} CPUs; written {time.strftime('%Y-%m-%d %H:%M')}.",
            "",
            "## What was tried, and why", "",
            "| config | " + " | ".join(f"`{n}`" for n in spec.space) + " | planner | why |",
            "|---|" + "---|" * len(spec.space) + "---|---|",
        ]
        for c in state.configs:
            lines.append(f"| {c.id} | " + " | ".join(_fmt(c.params.get(n)) for n in spec.space) +
                         f" | {c.source} | {c.why.replace('|', '/')} |")
        lines += ["", "## Results", "",
                  "Mean ± standard deviation of the metric over the finished seeds of each configuration, best first. "
                  "Pruned runs were stopped early; their value at that point is listed apart.", "",
                  "| config | " + " | ".join(f"`{n}`" for n in spec.space) + " | metric | per seed | pruned at | runs | "
                  "min/run |",
                  "|---|" + "---|" * len(spec.space) + "---|---|---|---|---|"]
        order = ranked + [r for r in rows if r["mean"] is None]
        minutes = minutes_per_run(state)
        for r in order:
            states = ", ".join(f"{n} {s}" for s, n in r["states"].items() if n)
            lines.append(f"| {r['config']} | " + " | ".join(_fmt(r["params"].get(n)) for n in spec.space) +
                         f" | {_mean_sd(r)} | {', '.join(f'{v:.3f}' for v in r['values']) or '–'} | "
                         f"{', '.join(f'{v:.3f}' for v in r['pruned_values']) or '–'} | {states} | "
                         f"{_fmt(minutes.get(r['config']), 1)} |")
        lines += ["", "### Every run", "", "| run | config | seed | state | metric | eval points (step: value) | "
                  "attempts | minutes | note |", "|---|---|---|---|---|---|---|---|---|"]
        for t in state.trials:
            pts = ", ".join(f"{p.train_steps}: {p.reward:.3f}" for p in t.points) or "–"
            lines.append(f"| {t.id} | {t.config_id} | {t.seed} | {t.state.value} | {_fmt(self.results.value(t))} | "
                         f"{pts} | {len(t.attempts)} | {t.seconds / 60:.1f} | {t.reason.replace('|', '/')} |")
        if plots:
            lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in plots]
        else:
            lines += ["", "(No plots: matplotlib is not installed, or no run has an eval point yet.)"]
        lines += ["", "## Best configuration", ""] + self._best(ranked, eval_n)
        lines += ["", "## Caveats", ""] + [f"- {c}" for c in self.caveats(eval_n)]
        path = root / "report.md"
        path.write_text("\n".join(lines) + "\n")
        return path

    def _best(self, ranked: list[dict[str, Any]], eval_n: int) -> list[str]:
        direction = self.spec.metric.direction
        default = next((r for r in self.rows if r["source"] == "default"), None)
        if not ranked:
            return ["No configuration has a finished run yet."]
        best = ranked[0]
        lines = [f"**{best['config']}**: " + ", ".join(f"`{n}` = {_fmt(v)}" for n, v in best["params"].items()) +
                 f": {_mean_sd(best)}."]
        if default is None or default["mean"] is None:
            lines.append("\nThere is no finished default configuration to compare it with.")
        elif default is best:
            lines.append("\nThe default configuration is the best one found.")
            if len(ranked) > 1:
                second = ranked[1]
                gap = compare(default, second, direction, eval_n, against="the runner-up")
                lines.append(f"\nThe runner-up, {second['config']} (" + ", ".join(
                    f"`{n}` = {_fmt(v)}" for n, v in second["params"].items()) + f"), scored {_mean_sd(second)}. "
                    + gap)
        else:
            lines.append(f"\nThe default ({default['config']}) scored {_mean_sd(default)}. "
                         + compare(best, default, direction, eval_n))
        return lines

    def caveats(self, eval_n: int) -> list[str]:
        spec, state = self.spec, self.state
        out = []
        done = [t for t in state.trials if t.state is TrialState.DONE]
        values = [v for t in done if (v := self.results.value(t)) is not None]
        if values:
            mean, _ = mean_spread(values)
            assert mean is not None
            out.append(f"Each eval point averages {eval_n} held-out episodes; at a reward near {mean:.2f} one point's "
                       f"sampling error alone is about ±{_eval_se(mean, eval_n):.3f}.")
        out.append("Runs are compared at equal train steps, not at equal time or equal episodes: a larger group or "
                   "batch sees more episodes per step and takes longer per step (min/run in the results table).")
        out.append(f"{spec.seeds} seed(s) per configuration. A seed sets the order of the training tasks; generation "
                   "is not seeded, so seeds are replicates, and a spread from two seeds is itself rough.")
        if state.by_state(TrialState.PRUNED):
            out.append("Pruned runs were judged at an early eval point; a configuration that starts slowly and "
                       "catches up later would be missed.")
        short = [t.id for t in done if "time budget" in t.reason]
        if short:
            out.append(f"Runs {', '.join(short)} hit the per-run time budget before their last step: on a busy "
                       "machine a slow configuration trains fewer steps.")
        failed = state.by_state(TrialState.FAILED)
        if failed:
            out.append("Failed runs: " + "; ".join(f"{t.id}: {t.reason}" for t in failed) + ".")
        left = state.by_state(TrialState.PLANNED, TrialState.RUNNING)
        if left:
            out.append(f"{len(left)} run(s) did not finish within the budget: {', '.join(t.id for t in left)}.")
        if len(self.rows) < 2:
            out.append("Fewer than two configurations finished: nothing is compared.")
        return out

    def plots(self, root: Path) -> list[str]:
        """The metric against the step for every run, and against each parameter. Names of the files written."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return []
        spec, state = self.spec, self.state
        runs = [t for t in state.trials if t.points]
        if not runs:
            return []
        names = [STEP_PLOT]
        colour = {c.id: f"C{i % 10}" for i, c in enumerate(state.configs)}  # tab10, matplotlib's default cycle
        lines: list[Line] = []
        labelled: set[str] = set()
        for t in runs:
            label = None
            if t.config_id not in labelled:
                labelled.add(t.config_id)
                label = f"{t.config_id}: " + ", ".join(f"{n.split('.', 1)[-1]}={_fmt(t.params[n])}" for n in spec.space)
            style = "--" if t.state is TrialState.PRUNED else "-"
            lines.append(Line(trial_curve(t), label=label,
                              style={"linestyle": style, "marker": "o", "color": colour[t.config_id], "alpha": 0.85}))
            if t.state is TrialState.PRUNED:
                last = t.points[-1]
                lines.append(Line(xy=[(last.train_steps, last.reward)],
                                  style={"marker": "x", "color": "black", "markersize": 9}))
        plot_curves(Panel(lines, x="steps", xlabel="policy version (train steps)", ylabel=spec.metric.source.value,
                          legend="best", legend_fontsize=7),
                    path=root / STEP_PLOT, title="metric at each eval point (dashed, x: pruned)", dpi=110)
        for name, p in spec.space.items():
            fname = param_plot_name(name)
            self._param_plot(plt, name, p, colour, root / fname)
            names.append(fname)
        return names

    def _param_plot(self, plt: Any, name: str, p: Param, colour: dict[str, Any], path: Path) -> None:
        state = self.state
        order = {c.id: i for i, c in enumerate(state.configs)}
        axis = _XAxis(p, [c.params[name] for c in state.configs], len(order))
        fig, ax = plt.subplots(figsize=(6, 4))
        for t in state.trials:
            v = self.results.value(t) if t.state is TrialState.DONE else (
                t.points[-1].reward if t.points and t.state is TrialState.PRUNED else None)
            if v is not None:
                ax.scatter([axis.x(t.params[name], order[t.config_id])], [v], color=colour[t.config_id], alpha=0.8,
                           marker="o" if t.state is TrialState.DONE else "x")
        for r in self.rows:
            if r["mean"] is not None:
                ax.errorbar([axis.x(r["params"][name], order[r["config"]])], [r["mean"]], yerr=[r["sd"] or 0],
                            fmt="_", color="black", markersize=16, capsize=4)
        if axis.log:
            ax.set_xscale("log")
        if axis.positions:
            ax.set_xticks(list(axis.positions.values()), list(axis.positions))
        elif p.type is ParamType.CHOICE and axis.numeric:
            ax.set_xticks(axis.numeric, [_fmt(c) for c in p.choices or []])
            ax.minorticks_off()
        ax.margins(x=0.15)
        ax.set_xlabel(name)
        ax.set_ylabel(self.spec.metric.source.value)
        ax.set_title(f"metric vs {name} (o: run, x: pruned, bar: mean ± sd)", fontsize=9)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
