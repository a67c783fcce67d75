"""reasoning-gym datasets as a task source: ``rg:NAME`` works wherever a built-in task name does
(``agentjet.tasks.get_task``). Needs the ``rg`` extra (``pip install 'agentjet[rg]'``, reasoning-gym 0.1.25).

Names (docs/environments.md):

- ``rg:chain_sum``: one dataset at its defaults;
- ``rg:chain_sum:min_terms=2,max_terms=2``: with knobs, the fields of the dataset's config (values read as JSON
  scalars, else as strings); ``level=N`` starts from the dataset's curriculum at level N
  (``reasoning_gym.factory.CURRICULA``), and the other knobs override it; ``size`` and ``seed`` are the
  generator's (defaults 1000 and 0);
- ``rg:chain_sum+spell_backward:level=0``: a mixture, run as a cocktail: each dataset is its own task type, and
  the recommended run gives each an equal share of every batch (``training.task_ratios``);
- ``rg:path/to/mix.yaml`` (or ``.json``): ``datasets: {NAME: {knob: value, ...}, ...}``, for knobs the name
  cannot carry (lists, strings with ``+ , :``).

Each question's prompt: the answer format as the system prompt (``<answer>...</answer>``, reasoning-gym's "direct"
prompt), ``EXAMPLES`` worked examples from the train split (question, then the answer in that format), then the
question. The reward extracts the answer (``reasoning_gym.utils.extract_answer``: the last
``<answer>`` block; none gives 0.0) and scores it with the dataset's own ``score_answer(answer, entry)``.

Splits: a dataset's distinct questions are split by a hash of the question text: those hashing into the lowest
quarter are held out for ``eval``, the rest are ``train``. The eval split must hold ``MIN_EVAL`` (50) distinct
questions: the generator's size is doubled (up to ``MAX_SIZE``) until it does; when the knobs leave too few
distinct questions for that, the ``MIN_EVAL`` lowest-hashing ones are held out instead, if the train split keeps
at least as many; else loading fails with an error naming the knobs.

Difficulty levels (``ladders()``, for ``ajet demo --levels``; docs/environments.md): a dataset with a
reasoning-gym curriculum has its levels ``0 .. top``, level ``k`` being ``rg:NAME:level=k`` (each knob of the
curriculum at its ``k``-th value, clamped at its last) with the name's other knobs (``size``, ``seed``,
``allow_negation``...). ``top`` is the last level whose config differs from the one below it. The task as named is
one of them when it gives ``level=N`` and no knob of the curriculum, or when its knobs equal a level's
(``rg:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1`` is level 0); a dataset at its default knobs
is usually none of them, and training then starts at level 0. Every level's train split leaves out the named
task's held-out questions (the levels' ranges are inclusive, so a harder level holds the easier questions too).
A dataset without a curriculum has no levels.

Pure Python: no server imports; reasoning_gym is imported on first use.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from agentjet.tasks.recommended import Recommended
from agentjet.tasks.source import TaskError, TaskLadder, in_turn

log = logging.getLogger(__name__)

PREFIX = "rg:"
EXTRA_HINT = "pip install 'agentjet[rg]'"
SPLITS = ("train", "eval")
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
EVAL_FRACTION = 0.25  # a question is held out when its hash falls in the lowest quarter
MIN_EVAL = 50  # distinct held-out questions each dataset must have
DEFAULT_SIZE = 1000  # questions generated per dataset (the generator's ``size``)
MAX_SIZE = 16_000  # the generator's size is doubled up to this while the eval split is short
DEFAULT_SEED = 0  # the generator's seed (reasoning-gym's own default is a random one)
LEVEL = "level"  # the knob that picks a curriculum level
EXAMPLES = 2  # worked examples (train questions with their answers) every prompt shows before its question

SAMPLING: dict[str, Any] = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 48}
EVAL_SAMPLING: dict[str, Any] = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 48, "seed": 10_000}


def _recommended(datasets: int) -> Recommended:
    """A starting point (the addition task's run); a mixture gets equal task-type shares. Not yet measured."""
    return Recommended(learning_rate=2e-5, group_size=8, batch_groups=4, steps=60, eval_n=MIN_EVAL * datasets,
                       eval_every_s=120, concurrency=32, stop={"patience": 2, "min_delta": 0.02, "min_evals": 3})


# ---- names -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset of an ``rg:`` name: its reasoning-gym name and knobs."""

    name: str
    knobs: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        """``name:k=v,...`` (knobs sorted): the canonical form."""
        if not self.knobs:
            return self.name
        return self.name + ":" + ",".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
                                          for k, v in sorted(self.knobs.items()))


def parse_value(text: str) -> Any:
    """A knob's value: a JSON scalar (``2``, ``0.5``, ``true``, ``null``), else the text itself."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if value is None or isinstance(value, bool | int | float | str) else text


def parse_knobs(text: str, where: str) -> dict[str, Any]:
    """``k=v,k=v`` -> {k: v}."""
    knobs: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TaskError(f"{where}: knob {item!r} must look like name=value (e.g. rg:chain_sum:min_terms=2)")
        knobs[key.strip()] = parse_value(value.strip())
    return knobs


def parse_name(spec: str) -> list[DatasetSpec]:
    """The datasets of an ``rg:`` name (the part after ``rg:``, or the whole name): ``A[:k=v,...]+B...`` or a
    config file."""
    body = spec.removeprefix(PREFIX).strip()
    if body.endswith(CONFIG_SUFFIXES):
        return parse_config(Path(body))
    if not body:
        raise TaskError("rg: needs a dataset name, e.g. rg:chain_sum or rg:chain_sum+spell_backward")
    datasets = []
    for part in body.split("+"):
        name, _, knobs = part.partition(":")
        if not name.strip():
            raise TaskError(f"rg:{body}: an empty dataset name (write rg:A+B+C)")
        datasets.append(DatasetSpec(name.strip(), parse_knobs(knobs, f"rg:{body}")))
    return _unique(datasets, f"rg:{body}")


def parse_config(path: Path) -> list[DatasetSpec]:
    """A task config file: ``datasets: {NAME: {knob: value}}`` (YAML or JSON)."""
    if not path.exists():
        raise TaskError(f"rg task config {path} does not exist")
    data = yaml.safe_load(path.read_text())
    entries = data.get("datasets") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise TaskError(f"{path}: expected 'datasets: {{NAME: {{knob: value, ...}}, ...}}'")
    extra = set(data) - {"datasets"}
    if extra:
        raise TaskError(f"{path}: unknown keys {sorted(extra)} (only 'datasets')")
    datasets = []
    for name, knobs in entries.items():
        if knobs is not None and not isinstance(knobs, dict):
            raise TaskError(f"{path}: the knobs of {name!r} must be a mapping, got {knobs!r}")
        datasets.append(DatasetSpec(str(name), dict(knobs or {})))
    return _unique(datasets, str(path))


def _unique(datasets: list[DatasetSpec], where: str) -> list[DatasetSpec]:
    names = [d.name for d in datasets]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TaskError(f"{where}: dataset(s) {dup} appear twice; each dataset is one task type")
    return datasets


# ---- reasoning-gym -------------------------------------------------------------------------------------------


def _factory() -> Any:
    try:
        from reasoning_gym import factory
    except ImportError as exc:
        raise TaskError(f"rg: tasks need reasoning-gym, which is not installed: {EXTRA_HINT}") from exc
    return factory


def check_dataset_name(name: str, known: list[str]) -> None:
    """Raise a ``TaskError`` listing the close names when ``name`` is not a reasoning-gym dataset."""
    if name == "composite":
        raise TaskError("rg:composite is reasoning-gym's mixer: write the mixture as rg:A+B+C instead")
    if name in known:
        return
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
    hint = f"close names: {', '.join(close)}" if close else "no close names"
    raise TaskError(f"unknown reasoning-gym dataset {name!r} ({hint}); the {len(known)} datasets are listed by "
                    "python -c 'import reasoning_gym; print(sorted(reasoning_gym.factory.DATASETS))'")


def make_config(spec: DatasetSpec, size: int) -> Any:
    """The dataset's config object: its curriculum's level (``level=N``) or its defaults, then the knobs."""
    factory = _factory()
    check_dataset_name(spec.name, sorted(factory.DATASETS))
    config_cls = factory.DATASETS[spec.name][1]
    knobs = {"seed": DEFAULT_SEED, **spec.knobs, "size": size}
    level = knobs.pop(LEVEL, None)
    names = {f.name for f in fields(config_cls)} if is_dataclass(config_cls) else set(knobs)
    unknown = sorted(set(knobs) - names)
    if unknown:
        close = {k: difflib.get_close_matches(k, names, n=2) for k in unknown}
        raise TaskError(f"rg:{spec.name}: unknown knob(s) {close} (key: close names); its knobs are "
                        f"{sorted(names)}, and {LEVEL!r} (a curriculum level)")
    base = _curriculum_config(factory, spec.name, level) if level is not None else {}
    try:
        config = config_cls(**{**base, **knobs})
        if hasattr(config, "validate"):
            config.validate()
    except (AssertionError, TypeError, ValueError) as exc:
        raise TaskError(f"rg:{spec.label()}: reasoning-gym refuses these knobs: {exc or type(exc).__name__}") from exc
    return config


def _curriculum_config(factory: Any, name: str, level: Any) -> dict[str, Any]:
    """The config fields of ``name``'s curriculum at ``level`` (the easiest: 0)."""
    if name not in factory.CURRICULA:
        raise TaskError(f"rg:{name} has no curriculum, so no {LEVEL!r} knob: set its knobs instead")
    if not isinstance(level, int) or isinstance(level, bool) or level < 0:
        raise TaskError(f"rg:{name}: {LEVEL} must be an integer >= 0, got {level!r}")
    curriculum = factory.create_curriculum(name)
    curriculum.set_global_level(level)
    config = curriculum.generate_configuration()
    return {f.name: getattr(config, f.name) for f in fields(config) if f.name not in ("seed", "size")}


def curriculum_fields(name: str) -> set[str]:
    """The config fields ``name``'s curriculum sets (empty: no curriculum)."""
    factory = _factory()
    if name not in factory.CURRICULA:
        return set()
    out: set[str] = set()
    for attr in factory.create_curriculum(name).attributes.values():
        out |= {getattr(attr, f) for f in ("field_name", "lower_field_name", "upper_field_name") if hasattr(attr, f)}
    return out


def top_level(name: str) -> int:
    """The last curriculum level of ``name`` whose config differs from the one below it."""
    factory = _factory()
    top = max(len(a.levels) for a in factory.create_curriculum(name).attributes.values()) - 1
    while top > 0 and _curriculum_config(factory, name, top) == _curriculum_config(factory, name, top - 1):
        top -= 1
    return top


def question_hash(question: str) -> float:
    """The question's place in [0, 1), from sha256 of its text."""
    return int(hashlib.sha256(question.encode()).hexdigest()[:16], 16) / 2**64


# ---- one dataset -------------------------------------------------------------------------------------------


class Dataset:
    """One reasoning-gym dataset with its knobs: its distinct questions, split by hash, and its scorer."""

    def __init__(self, spec: DatasetSpec, exclude: frozenset[str] = frozenset()) -> None:
        """``exclude``: questions kept out of the train split (another task's held-out ones)."""
        self.spec = spec
        self.exclude = exclude
        size = spec.knobs.get("size", DEFAULT_SIZE)
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise TaskError(f"rg:{spec.name}: size must be an integer >= 1, got {size!r}")
        self.size = size
        self.data, self.entries = self._generate(self.size)
        while self._eval_by_threshold() < MIN_EVAL and self.size < MAX_SIZE:
            data, entries = self._generate(min(2 * self.size, MAX_SIZE))
            grew = len(entries) > len(self.entries)
            self.size, self.data, self.entries = data.size, data, entries
            if not grew:
                break  # every question the knobs allow is already here
        self.splits = self._split()

    def _generate(self, size: int) -> tuple[Any, dict[str, dict[str, Any]]]:
        factory = _factory()
        config = make_config(self.spec, size)
        data = factory.DATASETS[self.spec.name][0](config=config)
        entries: dict[str, dict[str, Any]] = {}
        for entry in data:
            entries.setdefault(str(entry["question"]), entry)
        return data, entries

    def _eval_by_threshold(self) -> int:
        return sum(question_hash(q) < EVAL_FRACTION for q in self.entries)

    def _split(self) -> dict[str, list[str]]:
        ranked = sorted(self.entries, key=question_hash)
        held = [q for q in ranked if question_hash(q) < EVAL_FRACTION]
        if len(held) < MIN_EVAL:
            if len(ranked) < 2 * MIN_EVAL:
                raise TaskError(
                    f"rg:{self.spec.label()}: its knobs {self.spec.knobs or '(defaults)'} allow only {len(ranked)} "
                    f"distinct questions (generator size {self.size}), too few for {MIN_EVAL} held-out ones and as "
                    "many to train on: widen the knobs (larger ranges) or raise the curriculum level")
            held = ranked[:MIN_EVAL]
        eval_set = set(held)
        return {"eval": sorted(eval_set),
                "train": sorted(q for q in ranked if q not in eval_set and q not in self.exclude)}

    def examples(self, n: int = EXAMPLES) -> list[tuple[str, str]]:
        """The worked examples every prompt shows: the ``n`` train questions with the highest hash, and their
        answers (never an eval question)."""
        questions = sorted(self.splits["train"], key=question_hash, reverse=True)[:n]
        return [(q, str(self.entries[q].get("answer"))) for q in questions]

    def score(self, text: str, entry: dict[str, Any]) -> float:
        """The extracted answer scored by the dataset's own ``score_answer`` (no answer block: 0.0)."""
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(text)
        if answer is None:
            return 0.0
        try:
            return float(self.data.score_answer(answer, entry))
        except Exception:  # a scorer that fails on a malformed answer: the answer is wrong
            log.debug("rg:%s: score_answer failed on %r", self.spec.name, answer, exc_info=True)
            return 0.0


def answer_prompt() -> str:
    """The answer format the reward expects (reasoning-gym's "direct" system prompt)."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return str(SYSTEM_PROMPTS["direct"])


# ---- the task source ---------------------------------------------------------------------------------------


class ReasoningGymTask:
    """The task source of an ``rg:`` name (``agentjet.tasks.source.TaskSource``): one task type per dataset."""

    SAMPLING = SAMPLING
    EVAL_SAMPLING = EVAL_SAMPLING

    def __init__(self, datasets: list[DatasetSpec], name: str | None = None,
                 held_out: Mapping[str, frozenset[str]] | None = None) -> None:
        """``held_out``: by dataset, questions kept out of its train split (a level's: the named task's held-out)."""
        self.NAME = name or PREFIX + "+".join(d.label() for d in datasets)  # as given, else the canonical form
        self.datasets = {d.name: Dataset(d, (held_out or {}).get(d.name, frozenset())) for d in datasets}
        ratios = {name: 1 / len(datasets) for name in self.datasets} if len(datasets) > 1 else {}
        self.RECOMMENDED = _recommended(len(datasets)).model_copy(update={"task_ratios": ratios})
        self._prompt = answer_prompt()

    def make_task(self, name: str, question: str, split: str) -> dict[str, Any]:
        data = self.datasets[name]
        entry = data.entries[question]
        return {"task_id": f"rg-{name}-{split}-{hashlib.sha256(question.encode()).hexdigest()[:12]}",
                "task_type": name, "split": split, "dataset": name, "question": question,
                "answer": entry.get("answer"), "entry": entry, "messages": self.messages(data, question)}

    def messages(self, data: Dataset, question: str) -> list[dict[str, str]]:
        """The answer format as the system prompt, ``EXAMPLES`` (2) worked examples from the train split, then the
        question. Without an example SmolLM2-135M never used the answer block (0 of 8 chain_sum replies, reward
        0.0, so no GRPO group had a signal); with one about half did, and the other half wrote the sum outside it
        (``0 + 4 = 4``); with two, 48 of 48 did (docs/environments.md)."""
        shots = []
        for example, answer in data.examples():
            shots += [{"role": "user", "content": example}, {"role": "assistant", "content": f"<answer>{answer}</answer>"}]
        return [{"role": "system", "content": self._prompt}, *shots, {"role": "user", "content": question}]

    def generate_tasks(self, split: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` tasks from ``split``, the datasets in turn (equal shares); each dataset cycles through a seeded
        shuffle of its split, so ``n`` may exceed it (items repeat). Deterministic in (split, n, seed)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if n < 0:
            raise ValueError("n must be >= 0")
        orders = {}
        for name, data in self.datasets.items():
            questions = list(data.splits[split])
            random.Random(f"rg:{name}:{split}:{seed}").shuffle(questions)
            orders[name] = questions
        return [self.make_task(name, question, split) for name, question in in_turn(orders, n)]

    def reward(self, task: dict[str, Any], text: str) -> float:
        """The dataset's ``score_answer`` of the answer extracted from ``text``."""
        return self.datasets[str(task["dataset"])].score(text, task["entry"])

    def ladders(self) -> dict[str, TaskLadder]:
        """The difficulty levels of each dataset that has a curriculum (see the module docstring); in a mixture
        where some have one, each other dataset is one level, as named. None when no dataset has a curriculum."""
        with_levels = {name for name in self.datasets if curriculum_fields(name)}
        if not with_levels:
            return {}
        return {name: dataset_ladder(data) if name in with_levels else fixed_ladder(data)
                for name, data in self.datasets.items()}


def fixed_ladder(data: Dataset) -> TaskLadder:
    """A dataset without levels in a mixture that has them: one level, the dataset as named."""
    return TaskLadder(task_type=data.spec.name, labels=(f"as named: {data.spec.label()}",),
                      make=lambda _: ReasoningGymTask([data.spec], PREFIX + data.spec.label()), start=0, named=0)


def dataset_ladder(data: Dataset) -> TaskLadder:
    """One dataset's levels: ``rg:NAME:level=k`` with the named spec's other knobs, each level's train split
    without the named dataset's held-out questions."""
    spec = data.spec
    fields_ = curriculum_fields(spec.name)
    other = {k: v for k, v in spec.knobs.items() if k not in fields_ and k != LEVEL}
    top = top_level(spec.name)
    rungs = [DatasetSpec(spec.name, {**other, LEVEL: k}) for k in range(top + 1)]
    factory = _factory()
    level = spec.knobs.get(LEVEL)
    if isinstance(level, int) and not isinstance(level, bool) and not fields_ & set(spec.knobs):
        named: int | None = min(level, top)
    else:
        mine = {f: getattr(data.data.config, f) for f in fields_}
        named = next((k for k in range(top + 1)
                      if {f: _curriculum_config(factory, spec.name, k).get(f) for f in fields_} == mine), None)
    held = {spec.name: frozenset(data.splits["eval"])}

    def make(k: int) -> ReasoningGymTask:
        return ReasoningGymTask([rungs[k]], PREFIX + rungs[k].label(), held_out=held)

    def label(k: int) -> str:
        config = _curriculum_config(factory, spec.name, k)
        return f"level={k}: " + ",".join(f"{f}={config[f]}" for f in sorted(fields_) if f in config)

    return TaskLadder(task_type=spec.name, labels=tuple(label(k) for k in range(top + 1)), make=make,
                      start=named if named is not None else 0, named=named)


@lru_cache(maxsize=16)
def load(name: str) -> ReasoningGymTask:
    """The task source of ``rg:...`` (cached: a name is generated once per process)."""
    return ReasoningGymTask(parse_name(name), name)
