"""A program of studies from one topic: design a study, run it, read its results, design the next one (narrow a
range, extend it past an edge the best sits on, add a knob, more seeds, or stop with a conclusion) until the program's budget is spent.

    <program dir>/program.json     the program state (written, then renamed, after every change)
    <program dir>/log.md           the research log: what was asked, found, tried next and why
    <program dir>/program.md       the conclusions with their evidence
    <program dir>/studies/NN-slug  each study's own directory (spec.yaml, design.json, report.md, ...)

A killed program is continued by the same command: a finished study is not run again, the running one is
continued by its own study state, and the next one is designed from the last finished report.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from agentjet.apps.research.results import StudyResults
from agentjet.apps.research.spec import Direction, StudySpec
from agentjet.apps.research.state import StudyStore
from agentjet.apps.research.topic import (
    PRUNE_MARGIN,
    PRUNE_REASON,
    REPLICATE_REASON,
    KnobDesign,
    Setting,
    StudyDesign,
    bounds,
    describe_design,
    knob_range,
    offline_design,
    rank_settings,
    settings_catalog,
)
from agentjet.files import write_atomic

MAX_SEEDS = 4


class NextStep(BaseModel):
    """What the planner does after a study: another study (with the number that motivated it) or stop."""

    model_config = ConfigDict(extra="forbid")
    action: Literal["narrow", "extend", "add_knob", "more_seeds", "stop"]
    why: str = Field(min_length=1)
    cites: str = Field(min_length=1, description="the number from the last report that motivated this step")
    design: StudyDesign | None = None
    conclusion: str = ""


class StudyEntry(BaseModel):
    index: int
    dir: str
    design: StudyDesign
    why: str
    cites: str = ""
    state: Literal["running", "done"] = "running"
    found: str = ""


class ProgramBudget(BaseModel):
    model_config = ConfigDict(extra="forbid")
    trials: int | None = Field(None, ge=1)
    hours: float | None = Field(None, gt=0)


class ProgramState(BaseModel):
    topic: str
    budget: ProgramBudget
    started: float = Field(default_factory=time.time)
    elapsed_s: float = 0.0
    sessions: int = 0
    studies: list[StudyEntry] = Field(default_factory=list)
    log: list[str] = Field(default_factory=list)
    conclusions: list[str] = Field(default_factory=list)
    finished: bool = False


class Designer(Protocol):
    def first(self, topic: str, trials: int | None) -> StudyDesign: ...

    def next(self, design: StudyDesign, findings: Findings, report: str, trials_left: int | None) -> NextStep: ...


# ---------------------------------------------------------------------- reading a study's results
def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


@dataclass(frozen=True)
class Findings:
    """What a program reads of one finished study: its spec and its per-configuration results (the rows of
    :meth:`StudyResults.configs`: params, mean, sd, n_done)."""

    spec: StudySpec
    configs: list[dict[str, Any]]

    @classmethod
    def of(cls, results: StudyResults) -> Findings:
        return cls(results.spec, results.configs())

    def _sign(self) -> int:
        return 1 if self.spec.metric.direction is Direction.MAXIMIZE else -1

    def best_and_default(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        scored = [r for r in self.configs if r["mean"] is not None]
        if not scored:
            return None, None
        best = max(scored, key=lambda r: self._sign() * r["mean"])
        defaults = self.spec.default_params()
        default = next((r for r in scored if defaults is not None and r["params"] == defaults), None)
        return best, default

    def noise(self) -> float | None:
        """The largest spread over seeds of any configuration (None with one seed each)."""
        spreads = [r["sd"] for r in self.configs if r["sd"] is not None]
        return max(spreads) if spreads else None

    def rival(self, best: dict[str, Any], default: dict[str, Any] | None) -> dict[str, Any] | None:
        """What the best configuration is measured against: the default, or (when the default is best) the
        runner-up."""
        if default is None:
            return None
        if best is not default:
            return default
        others = [r for r in self.configs if r is not best and r["mean"] is not None]
        if not others:
            return None
        return max(others, key=lambda r: self._sign() * r["mean"])

    def summary(self) -> str:
        best, default = self.best_and_default()
        if best is None:
            return "no configuration finished a run"
        text = f"best {json.dumps(best['params'])}: {fmt(best['mean'])} (n={best['n_done']})"
        if default is not None and default is not best:
            text += f"; default {json.dumps(default['params'])}: {fmt(default['mean'])}"
        elif (other := self.rival(best, default)) is not None:
            text += (f", the default; runner-up {json.dumps(other['params'])}: {fmt(other['mean'])} "
                     f"(n={other['n_done']})")
        spread = self.noise()
        return text + (f"; largest spread over seeds ±{spread:.3f}" if spread is not None else "; one seed each")


# ---------------------------------------------------------------------- the offline next step
def narrowed(knob: KnobDesign, value: Any) -> KnobDesign | None:
    """The knob's range around ``value``: a choice keeps the value and its neighbours, a number a quarter of its
    (log) span around it; None when the range cannot narrow."""
    if knob.type == "choice":
        choices = knob.choices or []
        if value not in choices or len(choices) <= 2:
            return None
        i = choices.index(value)
        kept = choices[max(0, i - 1): i + 2]
        return knob.model_copy(update={"choices": kept, "default": value if knob.default not in kept else knob.default})
    assert knob.low is not None and knob.high is not None
    if knob.log and value > 0:
        ratio = (knob.high / knob.low) ** 0.25
        low, high = max(knob.low, value / ratio), min(knob.high, value * ratio)
    else:
        half = (knob.high - knob.low) / 4
        low, high = max(knob.low, value - half), min(knob.high, value + half)
    if not low < high:
        return None
    default = knob.default if knob.default is not None and low <= float(knob.default) <= high else None
    return knob.model_copy(update={"low": low, "high": high, "default": default})


def _setting(name: str) -> Setting | None:
    return next((s for s in settings_catalog() if s.space_name == name), None)


def extended(knob: KnobDesign, value: Any) -> KnobDesign | None:
    """When the best ``value`` sits on an edge of a numeric knob's range and the setting's bounds go further: the
    range past that edge, with ``value`` as the baseline (a choice of ints doubles or halves it; a number range
    moves a quarter of its span back and its whole span on). None: not on an edge, or nothing beyond it."""
    setting = _setting(knob.name)
    if setting is None or setting.field.choices is not None or isinstance(value, bool) or \
            not isinstance(value, int | float):
        return None
    lo, hi, _ = bounds(setting.field)
    lo, hi = -math.inf if lo is None else lo, math.inf if hi is None else hi
    if knob.type == "choice":
        numbers = [c for c in knob.choices or [] if isinstance(c, int | float) and not isinstance(c, bool)]
        if len(numbers) < 2 or value not in (min(numbers), max(numbers)) or not isinstance(value, int):
            return None
        beyond = value * 2 if value == max(numbers) else value // 2
        if beyond == value or not lo <= beyond <= hi:
            return None
        return knob.model_copy(update={"choices": sorted({value, beyond}), "default": value,
                                       "reason": f"{value}, the best, sat on the edge of {numbers}: {value} against "
                                                 f"{beyond}, past it (bounds {setting.field.bounds_text()})"})
    if knob.low is None or knob.high is None:
        return None
    span = math.log(knob.high / knob.low) if knob.log and knob.low > 0 else knob.high - knob.low
    at = (math.log(value / knob.low) if knob.log and value > 0 else value - knob.low) / span if span else 0.5
    if 0.25 < at < 0.75:
        return None
    step = (lambda v, d: v * math.exp(d)) if knob.log and knob.low > 0 else (lambda v, d: v + d)
    low, high = (step(value, -span / 4), min(hi, step(value, span))) if at >= 0.75 else \
        (max(lo, step(value, -span)), step(value, span / 4))
    if (at >= 0.75 and high <= knob.high) or (at <= 0.25 and low >= knob.low) or not low < high:
        return None
    return knob.model_copy(update={"low": low, "high": high, "default": value,
                                   "reason": f"{value:g}, the best, sat at the {'top' if at >= 0.75 else 'bottom'} of "
                                             f"[{knob.low:g}, {knob.high:g}]: the range moves past it "
                                             f"(bounds {setting.field.bounds_text()})"})


def contender_choices(knob: KnobDesign, best: dict[str, Any], other: dict[str, Any] | None) -> KnobDesign:
    """A choice knob cut to the best's and its rival's values (more seeds where they are, none elsewhere)."""
    if knob.type != "choice" or other is None:
        return knob
    kept = [c for c in knob.choices or [] if c in (best["params"].get(knob.name), other["params"].get(knob.name))]
    return knob.model_copy(update={"choices": kept}) if len(kept) >= 2 and knob.default in kept else knob


def next_knob(topic: str, design: StudyDesign) -> KnobDesign | None:
    """The best-matching setting of the topic that the design does not search yet."""
    have = {k.name for k in design.knobs}
    siblings = frozenset().union(*(s.name_words for k in design.knobs if (s := _setting(k.name)) is not None))
    for _, setting, matched in rank_settings(topic, settings_catalog()):
        if setting.space_name in have or setting.name_words & siblings:  # group-size, then min-group-size: no
            continue
        knob = knob_range(setting)
        if knob is not None:
            knob.matched = matched
            knob.reason = f"the next setting the topic's words {matched} match; range: {knob.reason}"
            return knob
    return None


PRUNING: dict[str, Any] = {"prune": True, "prune_margin": PRUNE_MARGIN, "prune_reason": PRUNE_REASON}  # a new comparison


class OfflineDesigner:
    """Designs from the settings table (``topic.offline_design``) and reads results by fixed rules."""

    def __init__(self, topic: str) -> None:
        self.topic = topic

    def first(self, topic: str, trials: int | None) -> StudyDesign:
        return offline_design(topic, trials)

    def next(self, design: StudyDesign, findings: Findings, report: str, trials_left: int | None) -> NextStep:
        best, default = findings.best_and_default()
        if best is None:
            return NextStep(action="stop", why="no run of the last study finished", cites="0 finished runs",
                            conclusion="the last study gave no result; the program stops")
        spread = findings.noise()
        other = findings.rival(best, default)
        gap = None if other is None else abs(best["mean"] - other["mean"])
        seen = findings.summary()
        if gap is None or spread is None or abs(gap) <= spread:
            return self._inside_the_noise(design, best, other, gap, spread, seen)
        assert other is not None
        if best is not default and default is not None:
            step = self._extend(design, best, default, gap, spread)
            if step is not None:
                return step
            knobs = [narrowed(k, best["params"].get(k.name)) or k for k in design.knobs]
            if any(a != b for a, b in zip(knobs, design.knobs, strict=True)):
                return NextStep(action="narrow", cites=f"best {fmt(best['mean'])} vs default {fmt(default['mean'])} "
                                f"(gap {gap:.3f} > spread {spread:.3f})",
                                why=f"the best configuration {json.dumps(best['params'])} beats the default by more "
                                    "than the noise: look closer around it",
                                design=design.model_copy(update={"knobs": knobs, **PRUNING}))
        return self._add_knob(design, best, best is default, gap, spread, seen)

    def _inside_the_noise(self, design: StudyDesign, best: dict[str, Any], other: dict[str, Any] | None,
                          gap: float | None, spread: float | None, seen: str) -> NextStep:
        """More seeds of the best and its rival (none pruned), or stop: they do not differ beyond the noise."""
        cite = f"best ahead by {fmt(gap)}, spread ±{fmt(spread)}"
        finished = min(best["n_done"], other["n_done"]) if other is not None else best["n_done"]
        cut = design.prune and finished < design.seeds  # pruning left a contender short of its seeds
        if design.seeds >= MAX_SEEDS and not cut:
            versus = f"{json.dumps(best['params'])} and {json.dumps(other['params'])} do not differ" if other \
                else "no effect found"
            return NextStep(action="stop", cites=cite, why="still inside the noise at the most seeds",
                            conclusion=f"{self.topic}: {versus} beyond the noise ({seen})")
        seeds = min(MAX_SEEDS, design.seeds * 2) if design.seeds < MAX_SEEDS else design.seeds
        doubt = "the noise is unknown with one seed each" if spread is None else "the difference sits inside the " \
            "noise" + (f", with {finished} finished run(s) of a contender (the others pruned)" if cut else "")
        knobs = [contender_choices(k, best, other) for k in design.knobs]
        configs = math.prod(len(k.choices or []) if k.type == "choice" else 1 for k in knobs)
        runs = design.trials if any(k.type != "choice" for k in knobs) else seeds * configs
        update = {"seeds": seeds, "knobs": knobs, "trials": runs, "prune": False, "prune_reason": REPLICATE_REASON,
                  "seeds_reason": f"{seeds} seeds per configuration ({design.seeds} before): {doubt}",
                  "budget_reason": f"{seeds} seeds x {configs} configuration(s)" if runs != design.trials
                  else design.budget_reason}
        return NextStep(action="more_seeds", cites=cite, why=f"{doubt} ({seen}): the best and its rival again with "
                        f"{seeds} seeds", design=design.model_copy(update=update))

    def _extend(self, design: StudyDesign, best: dict[str, Any], default: dict[str, Any], gap: float,
                spread: float) -> NextStep | None:
        """The best beats the default and sits on an edge of a range: past that edge, the best as the baseline."""
        edge = [extended(k, best["params"].get(k.name)) for k in design.knobs]
        if all(e is None for e in edge):
            return None
        knobs = [e if e is not None else held(k, best["params"][k.name]) for k, e in zip(design.knobs, edge, strict=True)]
        found = f"{json.dumps(best['params'])} beats the default {json.dumps(default['params'])} " \
                f"({fmt(best['mean'])} vs {fmt(default['mean'])}, beyond the spread ±{spread:.3f})"
        return NextStep(action="extend", cites=f"best {fmt(best['mean'])} vs default {fmt(default['mean'])} "
                        f"(gap {gap:.3f} > spread {spread:.3f})",
                        why=f"{found}, and it sits on the edge of the range searched: try past it, against it as the "
                            "new baseline", conclusion=f"{self.topic}: {found}",
                        design=design.model_copy(update={"knobs": knobs, **PRUNING}))

    def _add_knob(self, design: StudyDesign, best: dict[str, Any], default_is_best: bool, gap: float, spread: float,
                  seen: str) -> NextStep:
        """Hold the knobs at the best values and add the next setting the topic matched; none left: stop."""
        extra = next_knob(self.topic, design)
        conclusion = f"{self.topic}: {'the default' if default_is_best else json.dumps(best['params'])} is best " \
                     f"({seen})"
        if extra is None:
            return NextStep(action="stop", cites=f"best ahead by {gap:.3f}", why="no setting left to add",
                            conclusion=conclusion)
        fixed = [held(k, best["params"][k.name]) for k in design.knobs]
        return NextStep(action="add_knob", cites=f"best ahead by {gap:.3f}, spread ±{spread:.3f}",
                        why=f"{conclusion}; hold it there and try the next setting {extra.name}",
                        design=design.model_copy(update={"knobs": [*fixed, extra], **PRUNING}),
                        conclusion=conclusion)


def held(knob: KnobDesign, value: Any) -> KnobDesign:
    """The knob held at one value (a choice of one)."""
    return knob.model_copy(update={"type": "choice", "choices": [value], "low": None, "high": None, "log": False,
                                   "default": value})


# ---------------------------------------------------------------------- the program
class ProgramStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def path(self) -> Path:
        return self.root / "program.json"

    def load(self) -> ProgramState | None:
        return ProgramState.model_validate_json(self.path.read_text()) if self.path.exists() else None

    def save(self, state: ProgramState) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, state.model_dump_json(indent=1))
        write_atomic(self.root / "log.md", "# Research log\n\n" + "\n".join(state.log) + "\n")
        write_atomic(self.root / "program.md", program_markdown(state))


def program_markdown(state: ProgramState) -> str:
    lines = [f"# Program: {state.topic}", "", "## Conclusions", ""]
    lines += [f"- {c}" for c in state.conclusions] or ["- none yet"]
    lines += ["", "## Studies", "", "| # | directory | why | cited | found |", "|---|---|---|---|---|"]
    for s in state.studies:
        lines.append(f"| {s.index} | {s.dir} | {s.why.replace('|', '/')} | {s.cites.replace('|', '/')} | "
                     f"{s.found.replace('|', '/') or s.state} |")
    return "\n".join(lines) + "\n"


def trials_used(root: Path, state: ProgramState) -> int:
    total = 0
    for s in state.studies:
        store = StudyStore(root / s.dir)
        if store.exists():
            total += sum(t.state.value != "planned" for t in store.load().trials)
    return total


StudyRunnerFn = Callable[[StudySpec, Path], Any]
SpecFn = Callable[[StudyDesign], StudySpec]


def budget_left(root: Path, state: ProgramState) -> tuple[int | None, str | None]:
    """(trials left or None for no limit, why the budget is spent or None)."""
    left = None
    if state.budget.trials is not None:
        left = state.budget.trials - trials_used(root, state)
        if left <= 0:
            return 0, f"{state.budget.trials} trials spent"
    if state.budget.hours is not None and state.elapsed_s >= state.budget.hours * 3600:
        return left, f"{state.budget.hours} hours spent"
    return left, None


def run_program(topic: str, root: Path, designer: Designer, make_spec: SpecFn, run_study: StudyRunnerFn,
                budget: ProgramBudget, note: Callable[[str], None] = lambda _: None) -> ProgramState:
    """Run (or continue) the program in ``root``."""
    store = ProgramStore(root)
    state = store.load() or ProgramState(topic=topic, budget=budget)
    state.budget = budget
    state.sessions += 1
    session_start = time.time() - state.elapsed_s
    store.save(state)
    while not state.finished:
        current = state.studies[-1] if state.studies and state.studies[-1].state == "running" else None
        if current is None:
            left, spent = budget_left(root, state)
            if spent:
                state.log.append(f"- Stopped: the program's budget is spent ({spent}).")
                if state.studies:
                    last = state.studies[-1]
                    state.conclusions.append(f"{state.topic}: when the budget ran out, {last.found} "
                                             f"[evidence: study {last.index}, {last.dir}/report.md]")
                state.finished = True
                break
            current = plan_next(state, root, designer, make_spec, left, note)
            store.save(state)
            if current is None:
                state.finished = True
                break
        spec = make_spec(current.design)
        run_study(spec, root / current.dir)
        current.state, current.found = "done", Findings.of(StudyResults.load(spec, root / current.dir)).summary()
        state.log.append(f"- Study {current.index} found: {current.found}.")
        state.elapsed_s = time.time() - session_start
        store.save(state)
    store.save(state)
    return state


def plan_next(state: ProgramState, root: Path, designer: Designer, make_spec: SpecFn, left: int | None,
              note: Callable[[str], None]) -> StudyEntry | None:
    """Design the next study (the first from the topic), or record the conclusion and return None."""
    index = len(state.studies) + 1
    if not state.studies:
        design = designer.first(state.topic, left)
        why, cites = "the topic", ""
        state.log.append(f"- Asked: {state.topic}")
    else:
        last = state.studies[-1]
        findings = Findings.of(StudyResults.load(make_spec(last.design), root / last.dir))
        report_path = root / last.dir / "report.md"
        report = report_path.read_text() if report_path.exists() else ""
        step = designer.next(last.design, findings, report, left)
        if step.conclusion:
            state.conclusions.append(f"{step.conclusion} [evidence: study {last.index}, {step.cites}]")
        if step.action == "stop" or step.design is None:
            state.log.append(f"- Stop after study {last.index} ({step.cites}): {step.why}.")
            return None
        design, why, cites = step.design, f"{step.action}: {step.why}", step.cites
        state.log.append(f"- Next, study {index} ({step.action}), because {cites}: {step.why}.")
    if left is not None and design.trials > left:
        design = design.model_copy(update={"trials": max(design.seeds, left),
                                           "budget_reason": f"{design.budget_reason}; cut to the program's {left} "
                                                            "runs left"})
    if state.budget.hours is not None:  # a study starts no run past the program's hours
        minutes = max(1.0, state.budget.hours * 60 - state.elapsed_s / 60)
        design = design.model_copy(update={"minutes": min(design.minutes or minutes, minutes)})
    entry = StudyEntry(index=index, dir=f"studies/{index:02d}-{design.knobs[0].name.split('.', 1)[1]}", design=design,
                       why=why, cites=cites)
    study_dir = root / entry.dir
    study_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(study_dir / "design.json", design.model_dump_json(indent=1))
    write_atomic(study_dir / "design.md", describe_design(design))
    note(f"study {index}: {why}" + (f" (cites {cites})" if cites else ""))
    state.studies.append(entry)
    return entry
