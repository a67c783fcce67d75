"""A client process for one task type, for cocktail training (the server sets the mix, e.g.
`ajet server --task-ratios math=0.7,words=0.3`). Its reward code is loaded from a file, so it can be
edited and the client restarted (same --client-id and --cursor) while the server keeps training.

    python examples/cocktail_client.py --server http://127.0.0.1:10086 --task-type words \
        --reward-file examples/rewards/words_v1.py --client-id words-1 --cursor runs/words.cursor
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
from pathlib import Path

from agentjet import SwarmClient
from agentjet.client.runner import Cursor, run_workflow

WORDS = ["apple", "river", "stone", "cloud", "music", "light", "paper", "green", "table", "house", "water", "dream"]


def load_reward(path: Path):
    spec = importlib.util.spec_from_file_location("reward_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reward


def tasks(task_type: str, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"task_id": f"{task_type}-{i}", "task_type": task_type, "word": rng.choice(WORDS)} for i in range(n)]


async def main(args: argparse.Namespace) -> None:
    reward_fn = load_reward(args.reward_file)
    print(f"client {args.client_id}: reward code {args.reward_file}", flush=True)

    async def workflow(task: dict, ep) -> float:
        reply = await ep.openai().chat.completions.create(
            model="agent", max_tokens=12, temperature=1.0,
            messages=[{"role": "user", "content": f"Write the word '{task['word']}' in capital letters."}])
        return reward_fn(task["word"], reply.choices[0].message.content)

    async with SwarmClient(args.server, client_id=args.client_id) as client:
        joined = client._joined
        if joined and joined.released_episodes:
            print(f"released {joined.released_episodes} episodes left open by the previous process", flush=True)
        cursor = Cursor(args.cursor) if args.cursor else None
        if cursor is not None and cursor.done:
            print(f"cursor: {len(cursor.done)} tasks already done; resuming", flush=True)
        summary = await run_workflow(client, workflow, tasks(args.task_type, args.tasks, args.seed),
                                     group_size=args.group_size, concurrency=args.concurrency, cursor=cursor)
    print(f"done: {summary.episodes} episodes, mean reward {summary.mean_reward:.3f}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--server", default="http://127.0.0.1:10086")
    p.add_argument("--task-type", default="words")
    p.add_argument("--reward-file", type=Path, default=Path(__file__).parent / "rewards" / "words_v1.py")
    p.add_argument("--client-id", default=None)
    p.add_argument("--cursor", type=Path, default=None)
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    asyncio.run(main(p.parse_args()))
