"""Built-in demo task: single-digit addition, "What is a + b? Reply with only the number."

Reward (binary, in [0, 1]): 1.0 when the last integer in the reply is the sum ("8", "The answer is 8.",
"3 + 5 = 8"), else 0.0 ("9", "88", "-8", "eight", no number). Trained replies often run to max_tokens, so
clients must keep length-truncated replies.

Splits: the 100 pairs (a, b) with a, b in 0..9 are divided deterministically by a hash of "a+b": 22 are
held out for ``eval``, ``train`` gets the other 78 (use an eval ``n`` that is a multiple of 22 so every
pair weighs the same). They never overlap. ``generate_tasks`` cycles through a seeded shuffle of its split,
so ``n`` may exceed the split's size (items repeat).

Why this task and these settings: see "Choosing the demo task" in docs/benchmarks.md.

Pure Python: no agentjet server imports.
"""

from __future__ import annotations

import hashlib
import random
import re

from agentjet.tasks.recommended import Recommended

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
                          concurrency=32, stop={"patience": 2, "min_delta": 0.02, "min_evals": 3})

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
