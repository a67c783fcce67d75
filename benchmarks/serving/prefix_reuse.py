"""Does keeping an episode's KV cache across its calls pay on the embedded engine? A harness (Claude Code, Codex)
resends its whole history on every call, some 12k tokens, so each call prefills it all again today.

    .venv/bin/python benchmarks/serving/prefix_reuse.py                         # CPU: 135M shapes, 2k, 6k, 12k
    .venv/bin/python benchmarks/serving/prefix_reuse.py --device cuda --lengths 4096,12288

A model with SmolLM2-135M's shapes and random weights, its context raised to 16k positions (a harness's prompt
does not fit SmolLM2's 8k; the cost of a step does not depend on the weights). For each prompt length P, one call
that generates ``--new-tokens`` R tokens, three ways:

- ``engine_call_s``: the embedded engine's ``generate`` on the P-token prompt (what a call costs today);
- ``full_s``: the same work in plain transformers: a forward over the P tokens into an empty cache, then R
  one-token steps;
- ``reused_s``: what it would cost if the episode's KV stayed: the cache already holds the first P - D tokens
  (the earlier calls'), so only the D new ones (the previous reply and the next turn: ``--delta``) are prefilled,
  then the same R steps.
``saving`` is ``full_s / reused_s``: how many times cheaper a call would be.

And what the engine's kept prefixes (``generator.prefix_cache_tokens``) make of it, in the same run:

- ``engine_kept_s``: the engine with its prefix cache, on the episode's next call. A first call on the first
  P - D tokens (untimed) is kept; then the call on those tokens, its reply and new tokens up to P, which
  prefills only what the kept entry lacks (``engine_reused_tokens`` of its P tokens were reused);
- ``engine_saving``: ``engine_call_s / engine_kept_s`` (``engine_call_s`` runs with the cache off).

JSON with commit and machine in benchmarks/results/prefix_reuse_<device>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # workloads.py

from agentjet.runtime.omp import prefer_passive_openmp  # noqa: E402

prefer_passive_openmp()

# isort: split
import torch  # noqa: E402
from workloads import MODEL_ROOT, RESULTS, SHAPES, machine, smollm2_tokenizer_dir  # noqa: E402

from agentjet.runtime.provenance import git_commit  # noqa: E402

CONTEXT = 16384


def long_model(dtype: torch.dtype) -> Path:
    """SmolLM2-135M's shapes, random weights, 16k positions (built once)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = MODEL_ROOT / f"smollm2-135m-random-16k-{str(dtype).removeprefix('torch.')}"
    if (out / "config.json").exists():
        return out
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    config = LlamaConfig(**{**SHAPES["135m"], "max_position_embeddings": CONTEXT},
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).to(dtype).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def decode(model: Any, cache: Any, last: torch.Tensor, steps: int) -> None:
    for _ in range(steps):
        out = model(input_ids=last, past_key_values=cache, use_cache=True)
        last = out.logits[:, -1:].argmax(-1)


@torch.no_grad()
def timed_call(model: Any, ids: torch.Tensor, reused: int, new_tokens: int, device: torch.device) -> float:
    """Seconds for one call on ``ids``: the first ``reused`` tokens already in the cache (not timed), the rest
    prefilled, then ``new_tokens`` one-token steps."""
    from transformers import DynamicCache

    cache = DynamicCache()
    if reused:
        model(input_ids=ids[:, :reused], past_key_values=cache, use_cache=True)
    sync(device)
    t0 = time.perf_counter()
    out = model(input_ids=ids[:, reused:], past_key_values=cache, use_cache=True)
    decode(model, cache, out.logits[:, -1:].argmax(-1), new_tokens - 1)
    sync(device)
    return time.perf_counter() - t0


def engine_call(path: Path, ids: list[int], new_tokens: int, device: str, kept_from: int = 0) -> tuple[float, int]:
    """Seconds for the engine's call on ``ids`` and the prompt tokens it reused. ``kept_from`` > 0: the prefix
    cache is on, and a first call on ``ids[:kept_from]`` was kept; the timed call is then that prompt, its reply
    and ``ids`` from there, cut to ``len(ids)`` tokens (the episode's next call)."""
    from agentjet.engines.base import SamplingParams
    from agentjet.engines.model import load_policy_model
    from agentjet.generators.hf.build import hf_generator
    from agentjet.runtime.blocking import run_blocking
    from agentjet.settings import GeneratorSettings, PlacementSettings

    gen = hf_generator(load_policy_model(path, PlacementSettings(device=device)),  # type: ignore[arg-type]
                       GeneratorSettings(max_batch_size=1, kv_cache_tokens=len(ids) + new_tokens + 16,
                                         prefix_cache_tokens=len(ids) + new_tokens if kept_from else 0))
    try:
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, stop_token_ids=())
        run_blocking(gen.generate(ids[:64], SamplingParams(max_tokens=2)))  # warm
        prompt = ids
        if kept_from:
            first = run_blocking(gen.generate(ids[:kept_from], params))
            prompt = [*ids[:kept_from], *first.token_ids, *ids[kept_from + len(first.token_ids):]][: len(ids)]
        before = gen.stats.get("prefix_reused_tokens", 0)
        t0 = time.perf_counter()
        result = run_blocking(gen.generate(prompt, params))
        seconds = time.perf_counter() - t0
        assert len(result.token_ids) >= 1
        return seconds, int(gen.stats.get("prefix_reused_tokens", 0) - before)
    finally:
        asyncio.run(gen.close())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[2048, 6144, 12288])
    p.add_argument("--new-tokens", type=int, default=32, help="tokens each call generates")
    p.add_argument("--delta", type=int, default=400, help="tokens new since the previous call (its reply and the "
                   "next turn): what a kept cache still prefills")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    path = long_model(dtype)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    vocab = model.config.vocab_size
    rows = []
    gen = torch.Generator().manual_seed(0)
    for n in args.lengths:
        ids = torch.randint(100, vocab - 1, (1, n), generator=gen).to(device)
        full = timed_call(model, ids, 0, args.new_tokens, device)
        reused = timed_call(model, ids, n - args.delta, args.new_tokens, device)
        engine, _ = engine_call(path, ids[0].tolist(), args.new_tokens, args.device)
        kept, reused_tokens = engine_call(path, ids[0].tolist(), args.new_tokens, args.device, n - args.delta)
        row = {"prompt_tokens": n, "engine_call_s": engine, "full_s": full, "reused_s": reused,
               "saving": full / reused, "prefill_share_of_call": 1 - reused / full,
               "engine_kept_s": kept, "engine_reused_tokens": reused_tokens, "engine_saving": engine / kept}
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"benchmark": "prefix_reuse", "command": " ".join(["benchmarks/serving/prefix_reuse.py", *sys.argv[1:]]),
              "commit": git_commit(Path(__file__).resolve().parents[2]), "machine": machine(device),
              "model": "135m shapes, random weights, 16k positions", "dtype": str(dtype), "new_tokens": args.new_tokens,
              "delta_tokens": args.delta, "rows": rows}
    out = args.output or RESULTS / f"prefix_reuse_{device.type}.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
