"""A task for research tests on the null engine, which always replies "The answer is 7.".

The answer is always 7 and a noisy judge accepts a correct reply 80% of the time and a wrong one 10% of
the time, so a group's rewards disagree and the server takes train steps (the null engine's steps change
nothing). A reply cut short by ``max_tokens`` ("The answer is") holds no 7: the metric separates
configurations by a real client setting, and both kinds still train.
"""

from __future__ import annotations

import random
import re

from agentjet.tasks import Recommended

NAME = "coin"
SAMPLING = {"temperature": 1.0, "max_tokens": 16}
EVAL_SAMPLING = {"temperature": 1.0, "max_tokens": 16, "seed": 0}
RECOMMENDED = Recommended(learning_rate=1e-5, group_size=2, batch_groups=1, steps=4,
                          eval_n=48)  # one eval point: about ±0.06 at 0.8
ACCEPT = {True: 0.8, False: 0.1}


def generate_tasks(split: str, n: int, seed: int = 0) -> list[dict]:
    return [{"task_id": f"coin-{split}-{seed}-{i}", "task_type": NAME, "answer": "7",
             "messages": [{"role": "user", "content": "What is 3 + 4?"}]} for i in range(n)]


def reward(task: dict, text: str) -> float:
    nums = re.findall(r"-?\d+", text)
    correct = bool(nums) and nums[-1] == task["answer"]
    return 1.0 if random.random() < ACCEPT[correct] else 0.0
