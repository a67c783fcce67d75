"""Built-in demo task: single-digit addition, "What is a + b? Reply with only the number."

Reward (binary, in [0, 1]): 1.0 when the last integer in the reply is the sum ("8", "The answer is 8.",
"3 + 5 = 8"), else 0.0 ("9", "88", "-8", "eight", no number). Trained replies often run to max_tokens, so
clients must keep length-truncated replies.

Splits: the 100 pairs (a, b) with a, b in 0..9 are divided deterministically by a hash of "a+b": 22 are
held out for ``eval``, ``train`` gets the other 78 (use an eval ``n`` that is a multiple of 22 so every
pair weighs the same). They never overlap. ``generate_tasks`` cycles through a seeded shuffle of its split,
so ``n`` may exceed the split's size (items repeat).

Why this task and these settings: see "Choosing the demo task" in docs/benchmarks.md.

Difficulty levels (``ladders()``, for ``ajet demo --levels``: docs/learning.md): the number of digits of the two
operands, ``DIGIT_LEVELS``: level 0 is the task above, unchanged (single digits, 0..9); level 1 adds a two-digit
operand to a single-digit one (either first), level 2 two two-digit operands, then 3 + 2 and 3 + 3 digits
(exactly that many digits: 10..99, 100..999). Each level holds out its pairs by the same hash of "a+b", so no
pair is trained at one level and held out at another; a level's pairs are drawn from a seeded stream (its space
is up to 810,000 pairs), distinct, cycling when ``n`` exceeds the split.

Pure Python: no agentjet server imports.
"""

from __future__ import annotations

import hashlib
import random
import re
import sys
from typing import cast

from agentjet.tasks.recommended import Recommended
from agentjet.tasks.source import TaskLadder, TaskSource

NAME = "addition"
SPLITS = ("train", "eval")
DIGITS = range(10)
EVAL_MOD = 4  # a pair is held out for eval iff sha256("a+b") % EVAL_MOD == 0

PROMPT = "What is {a} + {b}? Reply with only the number."

SAMPLING = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 10}
# Evaluation: the same temperature, with fixed per-task seeds ``EVAL_SAMPLING["seed"] + index``.
EVAL_SAMPLING = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 10, "seed": 10_000}
# ``steps`` is a ceiling: the demo's curriculum retires solved pairs and its stopping rule ends the run on
# an eval plateau.
RECOMMENDED = Recommended(learning_rate=2e-5, group_size=8, batch_groups=4, steps=60, eval_n=44, eval_every_s=120,
                          concurrency=32, stop={"patience": 2, "min_delta": 0.02, "min_evals": 3},
                          levels={"window": 8})
# (digits of one operand, digits of the other) per level; level 0 is the single-digit task (0..9)
DIGIT_LEVELS = ((1, 1), (2, 1), (2, 2), (3, 2), (3, 3))
MAX_DRAWS = 200  # a level's pair stream is drawn at most this many times per task asked for

_NUM = re.compile(r"-?\d+")


def _key(a: int, b: int) -> str:
    return f"{a}+{b}"


def in_eval_split(a: int, b: int) -> bool:
    return int(hashlib.sha256(_key(a, b).encode()).hexdigest(), 16) % EVAL_MOD == 0


def split_pairs(split: str) -> list[tuple[int, int]]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    want_eval = split == "eval"
    return [(a, b) for a in DIGITS for b in DIGITS if in_eval_split(a, b) == want_eval]


def make_task(a: int, b: int, split: str = "train") -> dict:
    return {
        "task_id": f"{NAME}-{split}-{_key(a, b)}",
        "task_type": NAME,
        "messages": [{"role": "user", "content": PROMPT.format(a=a, b=b)}],
        "answer": str(a + b),
        "a": a,
        "b": b,
        "split": split,
    }


def generate_tasks(split: str, n: int, seed: int = 0) -> list[dict]:
    """``n`` tasks from ``split``, deterministic in (split, n, seed); cycles when n exceeds the split."""
    if n < 0:
        raise ValueError("n must be >= 0")
    pairs = split_pairs(split)
    random.Random(f"{NAME}:{split}:{seed}").shuffle(pairs)
    return [make_task(*pairs[i % len(pairs)], split=split) for i in range(n)]


def reward(task: dict, text: str) -> float:
    """1.0 when the last integer in ``text`` equals the task's answer, else 0.0."""
    nums = _NUM.findall(text)
    return 1.0 if nums and nums[-1] == str(task["answer"]) else 0.0


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randrange(10) if digits == 1 else rng.randrange(10 ** (digits - 1), 10**digits)


def level_pairs(level: int, split: str, n: int, seed: int = 0) -> list[tuple[int, int]]:
    """Up to ``n`` distinct pairs of ``split`` at ``level`` (>= 1), from a seeded stream: deterministic in
    (level, split, n, seed)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    da, db = DIGIT_LEVELS[level]
    rng = random.Random(f"{NAME}:level={level}:{split}:{seed}")
    want_eval = split == "eval"
    seen: dict[tuple[int, int], None] = {}
    for _ in range(MAX_DRAWS * max(n, 1)):
        if len(seen) >= n:
            break
        a, b = _operand(rng, da), _operand(rng, db)
        if da != db and rng.random() < 0.5:
            a, b = b, a
        if in_eval_split(a, b) == want_eval:
            seen.setdefault((a, b), None)
    return list(seen)


class AdditionLevel:
    """Addition at a level >= 1 (``DIGIT_LEVELS``): the same prompt, reward, sampling and task type as level 0."""

    SAMPLING = SAMPLING
    EVAL_SAMPLING = EVAL_SAMPLING
    RECOMMENDED = RECOMMENDED

    def __init__(self, level: int) -> None:
        if not 1 <= level < len(DIGIT_LEVELS):
            raise ValueError(f"addition's levels above 0 are 1 .. {len(DIGIT_LEVELS) - 1}, got {level}")
        self.level = level
        self.NAME = f"{NAME}:level={level}"

    def generate_tasks(self, split: str, n: int, seed: int = 0) -> list[dict]:
        """``n`` tasks of ``split`` at this level, deterministic in (split, n, seed); cycles when the split runs out."""
        if n < 0:
            raise ValueError("n must be >= 0")
        pairs = level_pairs(self.level, split, n, seed)
        return [make_task(*pairs[i % len(pairs)], split=split) for i in range(n)] if pairs else []

    def reward(self, task: dict, text: str) -> float:
        return reward(task, text)


def level_label(level: int) -> str:
    da, db = DIGIT_LEVELS[level]
    return f"{da}+{db} digits"


def _at_level(level: int) -> TaskSource:
    return cast("TaskSource", sys.modules[__name__]) if level == 0 else AdditionLevel(level)


def ladders() -> dict[str, TaskLadder]:
    """The task's difficulty levels: digits (``DIGIT_LEVELS``); level 0 is this module, unchanged."""
    return {NAME: TaskLadder(task_type=NAME, labels=tuple(level_label(k) for k in range(len(DIGIT_LEVELS))),
                             make=_at_level, start=0, named=0)}
