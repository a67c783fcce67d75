"""From a research topic to a study: the knobs come from the settings table (``agentjet.settings``).

A design names the question, the metric, the task, the knobs with their ranges, the seeds and the budget,
each with its reason. The offline planner matches the topic's words to each live setting's name and
description (a word found in few settings counts more than one found in many) and to the task names, and
takes the ranges from the settings' bounds and defaults. An LLM design (``topic_llm``) goes through the same
``repair_design``: unknown settings are dropped, ranges are clamped to the settings' bounds, and a design left
with no knob is refused. ``study_from_design`` validates the result as any study file is validated.
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import math
import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentjet.apps.research.spec import Scalar, StudySpec, StudySpecError, validate_spec
from agentjet.settings.fields import SettingField, find_field, server_fields
from agentjet.tasks import DEFAULT_TASK, TASKS

STOPWORDS = frozenset(
    ["a", "an", "the", "and", "or", "of", "on", "in", "at", "to", "for", "with", "by", "from", "is", "are", "be", "does", "do", "did", "it", "its", "this", "that", "these", "those", "than", "what", "which", "how", "when", "whether", "help", "helps", "matter", "matters", "better", "worse", "more", "less", "much", "many", "any", "some", "our", "my", "we", "i", "you", "can", "could", "should", "would", "will", "vs", "versus", "if", "about", "into", "per", "as", "not", "no", "keep", "stay", "use", "get", "make", "work"])
MAX_KNOBS = 2
SEARCHABLE = (int, float, bool)


class DesignError(ValueError):
    """A design that cannot become a study; the message says why."""


class KnobDesign(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, description="server.<flag> of a setting")
    type: str = Field(description="float, int or choice")
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: list[Scalar] | None = None
    default: Scalar | None = None
    reason: str = ""
    matched: list[str] = Field(default_factory=list, description="the topic's words that matched this setting")


PRUNE_MARGIN = 0.15
PRUNE_REASON = (f"a run is stopped early only when it trails the best run at the same step by more than {PRUNE_MARGIN:g}: "
                "about two sampling errors of one 44-episode eval near 0.5 (±0.075), so one unlucky eval does not end it")
REPLICATE_REASON = "replicates measure the noise: none is stopped early, or the spread would be of the lucky ones"


class StudyDesign(BaseModel):
    """A proposed study, each choice with its reason (``design.json`` next to the study's ``spec.yaml``)."""

    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1)
    metric: str = "eval_reward"
    metric_reason: str = ""
    task: str = DEFAULT_TASK
    task_reason: str = ""
    knobs: list[KnobDesign] = Field(min_length=1, max_length=8)
    seeds: int = Field(2, ge=1, le=20)
    seeds_reason: str = ""
    trials: int = Field(8, ge=1, le=1000)
    minutes: float | None = Field(None, gt=0, description="no new run starts after this much study time")
    budget_reason: str = ""
    prune: bool = Field(True, description="early stopping (ASHA) of runs clearly behind the best at the same step")
    prune_margin: float = Field(PRUNE_MARGIN, ge=0, le=1, description="'clearly behind': by more than this")
    prune_reason: str = PRUNE_REASON
    planner: str = "offline"
    notes: list[str] = Field(default_factory=list, description="what was repaired, and why")


@dataclass(frozen=True)
class Setting:
    """A setting a study may search: a live, numeric, boolean or enumerated setting of the table."""

    field: SettingField
    name_words: frozenset[str]
    text_words: frozenset[str]

    @property
    def space_name(self) -> str:
        return f"server.{self.field.flag}"


def stem(word: str) -> str:
    """A crude stem: larger, large -> larg; groups -> group; learning -> learn."""
    for suffix in ("ing", "est", "er", "ed", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


def words(text: str) -> list[str]:
    return [stem(w) for w in re.findall(r"[a-z][a-z0-9]*", text.lower()) if w not in STOPWORDS]


def _inner(field: SettingField) -> Any:
    args = [a for a in typing.get_args(field.annotation) if a is not type(None)]
    return args[0] if len(args) == 1 else field.annotation


def searchable(field: SettingField) -> bool:
    inner = _inner(field)
    return field.live and (field.choices is not None or inner in SEARCHABLE)


def settings_catalog() -> tuple[Setting, ...]:
    """The settings a topic may touch, with the words of their names and descriptions."""
    out = []
    for f in server_fields():
        if not searchable(f):
            continue
        name_words = frozenset(words(" ".join((*f.path[-1:], f.flag, *f.aliases)).replace("_", " ").replace("-", " ")))
        if f.dotted == "learner.learning_rate":
            name_words |= {"lr"}
        out.append(Setting(f, name_words, frozenset(words(f.info.description or ""))))
    return tuple(out)


def bounds(field: SettingField) -> tuple[float | None, float | None, bool]:
    """(low, high, low is exclusive) from the field's constraints."""
    low = high = None
    open_low = False
    for m in field.info.metadata:
        if isinstance(m, annotated_types.Ge):
            low = float(m.ge)  # type: ignore[arg-type]
        elif isinstance(m, annotated_types.Gt):
            low, open_low = float(m.gt), True  # type: ignore[arg-type]
        elif isinstance(m, annotated_types.Le):
            high = float(m.le)  # type: ignore[arg-type]
        elif isinstance(m, annotated_types.Lt):
            high = float(m.lt) * (1 - 1e-9)  # type: ignore[arg-type]
    return low, high, open_low


def default_value(field: SettingField) -> Scalar | None:
    value = field.info.default
    if isinstance(value, enum.Enum):
        return str(value.value)
    return value if isinstance(value, bool | int | float | str) else None


def knob_range(setting: Setting) -> KnobDesign | None:
    """The setting's range for a first study: around its default, inside its bounds; None when it has none."""
    f = setting.field
    default = default_value(f)
    name = setting.space_name
    if f.choices is not None:
        return KnobDesign(name=name, type="choice", choices=list(f.choices), default=default,
                          reason=f"every value the setting takes ({f.bounds_text()}); default {f.default_text()}")
    inner = _inner(f)
    if inner is bool:
        return KnobDesign(name=name, type="choice", choices=[bool(default), not default], default=bool(default),
                          reason=f"on and off; default {f.default_text()}")
    low, high, _ = bounds(f)
    lo = -math.inf if low is None else low
    hi = math.inf if high is None else high
    if inner is int:
        if not isinstance(default, int):
            return None
        points = sorted({int(min(max(v, lo), hi)) for v in (default // 2, default, default * 2)} if default
                        else {int(min(max(v, lo), hi)) for v in (0, 1, 2)})
        if len(points) < 2:
            return None
        return KnobDesign(name=name, type="choice", choices=list(points), default=default,
                          reason=f"half, once and twice the default {default}, inside its bounds ({f.bounds_text()})")
    if not isinstance(default, int | float) or isinstance(default, bool):
        return None
    if default > 0:
        k_low, k_high = max(default / 4, lo), min(default * 4, hi)
        if not k_low < k_high:
            return None
        return KnobDesign(name=name, type="float", low=k_low, high=k_high, log=k_low > 0, default=float(default),
                          reason=f"a quarter to four times the default {default:g} on a log scale, inside its bounds "
                                 f"({f.bounds_text()})")
    top = min(hi, 0.1) if hi > 0 else None
    if top is None:
        return None
    return KnobDesign(name=name, type="float", low=0.0, high=top, default=0.0,
                      reason=f"from the default 0 (off) up to {top:g} (bounds {f.bounds_text()})")


def score(topic_words: set[str], setting: Setting, frequency: dict[str, int]) -> tuple[float, list[str]]:
    """How well the topic names this setting: a word in its name counts 3, in its description 1, each divided by
    how many settings share the word. Returns (score, the matched words)."""
    total = 0.0
    matched = []
    for w in sorted(topic_words):
        weight = 3.0 if w in setting.name_words else 1.0 if w in setting.text_words else 0.0
        if weight:
            total += weight / frequency[w]
            matched.append(w)
    return total, matched


def rank_settings(topic: str, catalog: tuple[Setting, ...]) -> list[tuple[float, Setting, list[str]]]:
    """The settings the topic's words match, best first (ties: the settings table's order)."""
    topic_words = set(words(topic))
    frequency: dict[str, int] = {}
    for s in catalog:
        for w in s.name_words | s.text_words:
            frequency[w] = frequency.get(w, 0) + 1
    ranked = []
    for s in catalog:
        value, matched = score(topic_words, s, frequency)
        if value > 0:
            ranked.append((value, s, matched))
    return sorted(ranked, key=lambda r: -r[0])


def match_task(topic: str) -> tuple[str, str]:
    """(task, reason): a built-in task the topic names, else the default task."""
    topic_words = set(words(topic))
    for name in TASKS:
        if stem(name) in topic_words:
            return name, f"the topic names the built-in task {name!r}"
    return DEFAULT_TASK, f"no task is named: the default task {DEFAULT_TASK!r} (built-in: {', '.join(TASKS)})"


def machine_budget(cpus: int | None = None) -> tuple[int, str]:
    """(trials, reason) that fit the machine when the user gives no budget."""
    n = cpus or os.cpu_count() or 1
    trials = 8 if n <= 4 else 16
    return trials, f"{n} CPU core(s): {trials} runs, one at a time"


def _knob_count(knob: KnobDesign) -> int:
    return len(knob.choices) if knob.choices else 3


def offline_design(topic: str, trials: int | None = None, cpus: int | None = None) -> StudyDesign:
    """The offline planner's study for a topic. Raises DesignError when no setting matches any word."""
    catalog = settings_catalog()
    ranked = rank_settings(topic, catalog)
    knobs: list[KnobDesign] = []
    used: set[str] = set()
    for value, setting, matched in ranked:
        if len(knobs) == MAX_KNOBS or (knobs and value < ranked[0][0] / 2):
            break
        if setting.name_words & used:  # a sibling of a chosen knob (group_size, min_group_size): one at a time
            continue
        knob = knob_range(setting)
        if knob is None:
            continue
        knob.matched = matched
        knob.reason = f"the topic's words {matched} match {setting.field.dotted} ({setting.field.info.description}); " \
                      f"range: {knob.reason}"
        knobs.append(knob)
        used |= setting.name_words
    if not knobs:
        raise DesignError(f"no setting matches the topic's words {sorted(set(words(topic)))}: name a setting "
                          "(e.g. learning rate, group size, temperature) or give --space")
    task, task_reason = match_task(topic)
    budget, budget_reason = machine_budget(cpus)
    if trials is not None:
        budget, budget_reason = trials, f"the budget given: {trials} runs"
    configs = math.prod(_knob_count(k) for k in knobs)
    seeds = 2 if budget >= 2 * min(configs, 4) else 1
    return StudyDesign(
        question=topic.strip(), metric="eval_reward",
        metric_reason="held-out eval reward at the last eval point: what the trained policy does on unseen tasks",
        task=task, task_reason=task_reason, knobs=knobs, seeds=seeds,
        seeds_reason=f"{seeds} seed(s) per configuration: {configs} configuration(s) in the space, {budget} runs",
        trials=max(budget, seeds), budget_reason=budget_reason, planner="offline")


def repair_design(raw: Any, planner: str = "llm") -> tuple[StudyDesign | None, list[str]]:
    """A proposed design checked against the settings table: (design or None, notes). Unknown settings are dropped
    (with the closest names), ranges clamped to the bounds, choices outside an enum dropped; a design with no
    knob left, or that does not have the shape of a design, is refused (None)."""
    if not isinstance(raw, dict):
        return None, ["refused: the proposal is not a JSON object"]
    notes: list[str] = []
    knobs: list[dict[str, Any]] = []
    by_name = {s.space_name: s for s in settings_catalog()}
    items = raw.get("knobs")
    if not isinstance(items, list):
        return None, ["refused: `knobs` is not a list"]
    for item in items:
        fixed = _repair_knob(item, by_name, notes)
        if fixed is not None:
            knobs.append(fixed)
    if not knobs:
        return None, [*notes, "refused: no usable knob is left"]
    task = raw.get("task")
    if task is not None and not (isinstance(task, str) and task in TASKS):
        notes.append(f"unknown task {raw.get('task')!r}: the default {DEFAULT_TASK!r} used")
        raw = {**raw, "task": DEFAULT_TASK}
    fields = {k: v for k, v in raw.items() if k in StudyDesign.model_fields and k not in ("knobs", "notes", "planner")}
    try:
        design = StudyDesign.model_validate({**fields, "knobs": knobs, "planner": planner})
    except ValidationError as exc:
        first = exc.errors()[0]
        return None, [*notes, f"refused: {'.'.join(str(x) for x in first['loc'])}: {first['msg']}"]
    design.notes = notes
    return design, notes


def _repair_knob(item: Any, by_name: dict[str, Setting], notes: list[str]) -> dict[str, Any] | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        notes.append(f"dropped a malformed knob {item!r:.80}")
        return None
    name = item["name"]
    if not name.startswith("server."):
        with contextlib.suppress(KeyError):
            name = "server." + find_field(name).flag
    setting = by_name.get(name)
    if setting is None:
        close = difflib.get_close_matches(name, list(by_name), n=3)
        notes.append(f"dropped unknown setting {item['name']!r}" + (f" (close: {close})" if close else ""))
        return None
    base = knob_range(setting)
    if base is None:
        notes.append(f"dropped {name}: it has no range to search")
        return None
    fixed: dict[str, Any] = {**base.model_dump(), "reason": str(item.get("reason") or base.reason),
                             "matched": item.get("matched") or []}
    if base.type == "choice":
        raw_choices = item.get("choices")
        proposed: list[Any] = raw_choices if isinstance(raw_choices, list) else []
        offered = [c for c in proposed if _allowed(setting, c)]
        dropped = [c for c in proposed if c not in offered]
        if dropped:
            notes.append(f"{name}: dropped the values {dropped} the setting does not take")
        if len(offered) >= 2:
            fixed["choices"] = offered
            fixed["default"] = base.default if base.default in offered else offered[0]
        return fixed
    low, high, open_low = bounds(setting.field)
    for end in ("low", "high"):
        value = item.get(end)
        if value is None:
            continue
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            notes.append(f"{name}.{end}={value!r} is not a number: {fixed[end]:g} used")
            continue
        clamped = min(max(float(value), low if low is not None else -math.inf), high if high is not None else math.inf)
        if open_low and low is not None and clamped <= low:
            clamped = fixed["low"]
        if clamped != value:
            notes.append(f"{name}.{end}={value} is outside the setting's bounds ({setting.field.bounds_text()}): "
                         f"clamped to {clamped:g}")
        fixed[end] = clamped
    if not fixed["low"] < fixed["high"]:
        notes.append(f"{name}: an empty range [{fixed['low']:g}, {fixed['high']:g}]: the default range used")
        fixed.update(low=base.low, high=base.high)
    fixed["log"] = fixed["low"] > 0
    if not fixed["low"] <= (fixed["default"] or 0) <= fixed["high"]:
        fixed["default"] = None
    return fixed


def _allowed(setting: Setting, value: Any) -> bool:
    f = setting.field
    if f.choices is not None:
        return str(value) in f.choices
    if _inner(f) is bool:
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    low, high, open_low = bounds(f)
    return (low is None or value > low or (value == low and not open_low)) and (high is None or value <= high)


def study_from_design(design: StudyDesign, base: dict[str, Any], extra: dict[str, Any] | None = None) -> StudySpec:
    """The design as a study, validated like a study file (a bad one raises StudySpecError)."""
    space = {}
    for k in design.knobs:
        param: dict[str, Any] = {"type": k.type}
        if k.type == "choice":
            param["choices"] = k.choices
        else:
            param.update(low=k.low, high=k.high, log=k.log)
        if k.default is not None:
            param["default"] = k.default
        space[k.name] = param
    raw: dict[str, Any] = {"question": design.question, "base": base,
                           "metric": {"source": design.metric},
                           "client": {"task": design.task}, "space": space, "seeds": design.seeds,
                           "budget": {"trials": max(design.trials, design.seeds)}
                           | ({"minutes": design.minutes} if design.minutes else {}),
                           "planner": {"kind": "grid" if all(k.type == "choice" for k in design.knobs) else "tpe"},
                           "early_stop": {"enabled": design.prune, "min_delta": design.prune_margin}}
    for key, value in (extra or {}).items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) and isinstance(raw.get(key), dict) else value
    return validate_spec(raw, "the planned study", Path.cwd())


def default_base() -> dict[str, Any]:
    """One server on the default model (the settings table's default)."""
    return {"servers": {"policy": {"model": find_field("model").default_text()}}}


def describe_design(design: StudyDesign) -> str:
    """The design as Markdown: what a person reads before the study runs."""
    lines = [f"**Question.** {design.question}", "",
             f"**Metric.** {design.metric}: {design.metric_reason}", "",
             f"**Task.** {design.task}: {design.task_reason}", "", "**Knobs.**", ""]
    for k in design.knobs:
        span = f"one of {k.choices}" if k.type == "choice" else \
            f"{k.type} in [{k.low:g}, {k.high:g}]" + (" (log)" if k.log else "")
        lines.append(f"- `{k.name}`: {span}, default {k.default}. Matched words: {k.matched or 'none'}. {k.reason}")
    lines += ["", f"**Seeds.** {design.seeds}: {design.seeds_reason}", "",
              f"**Budget.** {design.trials} runs: {design.budget_reason}", "",
              f"**Early stopping.** {'on' if design.prune else 'off'}: {design.prune_reason}", "",
              f"Planner: {design.planner}."]
    if design.notes:
        lines += ["", "**Repairs.**", "", *[f"- {n}" for n in design.notes]]
    return "\n".join(lines) + "\n"


def design_or_error(design: StudyDesign, base: dict[str, Any], extra: dict[str, Any] | None = None) -> StudySpec:
    try:
        return study_from_design(design, base, extra)
    except StudySpecError as exc:
        raise DesignError(str(exc)) from exc
