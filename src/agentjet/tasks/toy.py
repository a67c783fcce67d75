"""A toy task the tiny random model (``tiny-random``) can learn in a few train steps: the check behind
``ajet bench --quick``'s learning figures and the gate's seeded smoke test.

The prompt asks for a number; the reward is the share of the reply's characters that are digits (0.0 for an
empty reply). The tiny model's byte-level vocabulary holds many digit tokens (its corpus is full of sums), so the
random-init model starts near 0.29 on the held-out prompts and every token of a reply carries signal. Measured
here (seed 0-2, 14 steps, groups of 8, 2 groups a step, lr 1e-2, CPU): held-out eval 0.29 -> 0.75-1.0; with the
learning rate at 1e-4 (/ 100) it stays at 0.23-0.32 after 8 steps. A real model would find it trivial; it exists
to make a learning check that can fail.

Splits: ``train`` and ``eval`` prompts carry disjoint item numbers. Pure Python: no agentjet server imports.
"""

from __future__ import annotations

from agentjet.tasks.recommended import Recommended

NAME = "toy"
SPLITS = ("train", "eval")
PROMPT = "Item {i}: reply with a number."
EVAL_OFFSET = 10_000  # eval items are numbered from here, train items below

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 4}
EVAL_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 4, "seed": 500}
RECOMMENDED = Recommended(learning_rate=1e-2, group_size=8, batch_groups=2, steps=14, eval_n=32, eval_every_s=0,
                          concurrency=16, pool=64)


def generate_tasks(split: str, n: int, seed: int = 0) -> list[dict]:
    """``n`` tasks from ``split``, deterministic in (split, n); ``seed`` is accepted for the task interface."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ValueError("n must be >= 0")
    base = EVAL_OFFSET if split == "eval" else 0
    return [{"task_id": f"{NAME}-{split}-{base + i}", "task_type": NAME, "split": split,
             "messages": [{"role": "user", "content": PROMPT.format(i=base + i)}]} for i in range(n)]


def reward(task: dict, text: str) -> float:
    """The share of ``text``'s characters that are digits (0.0 for an empty reply)."""
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0
