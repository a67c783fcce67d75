"""Held-out accuracy of a model on the Tinker cookbook's arithmetic task, with the cookbook's own environment and
evaluator (issue 50, "Measure"). Runs in .venv-cookbook (`make setup-cookbook`), against `ajet server --tinker-key`.

`math_rl env=arithmetic` trains on `ArithmeticDataset` batches 0..n_batches-1 (each seeded by its index, 100 problems
"What is x + y?" with x, y in 0..100) and has no test set. This draws problems from other seeds and drops every pair
the training batches contain, so the set is disjoint from training; it scores them with `RLTestSetEvaluator` (the
cookbook's evaluator: its sampling, `ArithmeticEnv`'s reward, format and correctness). `--model-path` names a
`tinker://.../sampler_weights/...` path (math_rl's checkpoints.jsonl: a sampler path lives for the server's run);
without it the base model is scored.

    TINKER_API_KEY=tml-local-key .venv-cookbook/bin/python benchmarks/learning/cookbook_arithmetic_eval.py \\
        --base-url http://127.0.0.1:10086 --model-name <get_info().model_data.tokenizer_id> \\
        --renderer-name qwen3_instruct [--model-path tinker://.../sampler_weights/final]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from functools import partial

import numpy as np
import tinker
from tinker_cookbook import renderers
from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticEnv
from tinker_cookbook.rl.metric_util import RLTestSetEvaluator
from tinker_cookbook.rl.problem_env import ProblemGroupBuilder
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset
from tinker_cookbook.tokenizer_utils import get_tokenizer


def training_pairs(batch_size: int, n_batches: int) -> set[tuple[int, int]]:
    """The (x, y) pairs of math_rl's training batches, drawn as ArithmeticDataset draws them."""
    rng, seen = np.random.RandomState(None), set()
    for index in range(n_batches):
        rng.seed(index)
        for _ in range(batch_size):
            seen.add((int(rng.randint(0, 101)), int(rng.randint(0, 101))))
    return seen


class HeldOut(RLDataset):
    def __init__(self, pairs: list[tuple[int, int]], renderer: renderers.Renderer, group_size: int) -> None:
        self.pairs, self.renderer, self.group_size = pairs, renderer, group_size

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        prefix = ArithmeticEnv.standard_fewshot_prefix()  # as math_rl's builder (include_fewshot=True)
        return [ProblemGroupBuilder(env_thunk=partial(ArithmeticEnv, x, y, convo_prefix=prefix, renderer=self.renderer),
                                    num_envs=self.group_size) for x, y in self.pairs]

    def __len__(self) -> int:
        return 1


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--model-name", required=True, help="the directory get_info's tokenizer_id names")
    p.add_argument("--renderer-name", default="qwen3_instruct")
    p.add_argument("--model-path", default=None, help="a tinker:// sampler path (default: the base model)")
    p.add_argument("--problems", type=int, default=200)
    p.add_argument("--group-size", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=5, help="math_rl's default")
    p.add_argument("--train-batch-size", type=int, default=100, help="math_rl's groups_per_batch")
    p.add_argument("--train-batches", type=int, default=100, help="math_rl's arithmetic n_batches")
    p.add_argument("--seed", type=int, default=12345)
    args = p.parse_args()

    seen = training_pairs(args.train_batch_size, args.train_batches)
    rng, pairs = np.random.RandomState(args.seed), []
    while len(pairs) < args.problems:
        pair = (int(rng.randint(0, 101)), int(rng.randint(0, 101)))
        if pair not in seen and pair not in pairs:
            pairs.append(pair)
    renderer = renderers.get_renderer(args.renderer_name, tokenizer=get_tokenizer(args.model_name))
    service = tinker.ServiceClient(base_url=args.base_url)
    sampler = (service.create_sampling_client(model_path=args.model_path) if args.model_path
               else service.create_sampling_client(base_model=args.model_name))
    evaluator = RLTestSetEvaluator(HeldOut(pairs, renderer, args.group_size), max_tokens=args.max_tokens,
                                   name="heldout", num_groups_to_log=0)
    metrics = await evaluator(sampler)
    keep = {k: v for k, v in metrics.items() if k.endswith(("/correct", "/format", "/reward/total"))}
    print(json.dumps({"model_path": args.model_path or "base", "problems": len(pairs),
                      "disjoint_from_training_pairs": len(seen), **keep}, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
