"""Named LoRA adapters on one base (``agentjet.layouts.adapters``): what mixing adapters in one batch costs in
generation throughput, and what each more adapter costs in memory.

How to run (heavy on a shared machine: take the CPU lock)::

    flock /tmp/aj-cpu.lock .venv/bin/python benchmarks/serving/adapters.py             # SmolLM2-135M-Instruct, rank 8
    .venv/bin/python benchmarks/serving/adapters.py --quick                               # a smoke run

It prints one table and writes ``benchmarks/results/adapters_<device>.json`` (machine, device, commit: from
``$AGENTJET_COMMIT`` or git).

**Generation.** One engine with ``--adapters`` adapters (A, B, C, D by default; each given small random LoRA
weights, so they really differ) serves the same requests twice per repeat, the two variants taking turns:
``1 adapter`` (every row A) and ``N adapters mixed`` (rows round-robin A, B, C, D). ``--concurrency`` clients
each send their next request when the previous one returns (closed loop); random ``--prompt-tokens``-token
prompts, exactly ``--new-tokens`` new tokens each (EOS off), sampled with a seed per request. tok/s = generated
tokens / wall time, the median over ``--repeats`` after one untimed warm-up of each variant. The ratio mixed /
one adapter is measured in the same run (target >= 0.8x). For reference, in the same turns: the mixed rows
through PEFT's own mixed batch (``adapter_names``; the engine's per-row LoRA switched off) and the same requests
on the ordinary single-LoRA engine (``embedded_engine`` with the same rank, no adapter names).

**Memory.** Each configuration runs in a fresh subprocess so that its RSS is its own: load the base with ``n``
adapters, generate once with each, take one train step of each (so every adapter's AdamW state exists), free
what the allocator holds unused (``malloc_trim``), then read the RSS. Every adapter generates in one mixed batch
before and after the steps, so the per-row LoRA's stacked copy of the adapters' weights is held too. base + 4
adapters over base + 1 adapter (target <= 1.15x); the peak RSS (``ru_maxrss``) is recorded too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # workloads.py

from agentjet.runtime.omp import prefer_passive_openmp  # noqa: E402

prefer_passive_openmp()  # before torch loads: the process-wide OpenMP default, as in the server

# isort: split
import torch  # noqa: E402
from workloads import RESULTS, Req, closed_loop, machine, make_requests  # noqa: E402

ADAPTER_NAMES = "ABCDEFGHIJKLMNOP"
GEN_TARGET = 0.8
MEM_TARGET = 1.15


def adapter_names(n: int) -> list[str]:
    return list(ADAPTER_NAMES[:n])


def settings(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(generator, learner, placement) settings shared by every variant: the same slots, cache, LoRA rank and
    device."""
    from agentjet.settings import GeneratorSettings, LearnerSettings, LoraSettings, PlacementSettings

    gen = GeneratorSettings(max_batch_size=args.concurrency,
                            kv_cache_tokens=args.prompt_tokens + args.new_tokens + 64)
    return gen, LearnerSettings(lora=LoraSettings(rank=args.lora_rank)), PlacementSettings(device=args.device)


def randomise_adapters(engines: Any, seed: int) -> None:
    """Small random weights in every adapter (a fresh LoRA has B = 0: every adapter would be the base)."""
    from agentjet.engines.model import adapter_parameters

    def fill() -> None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name in engines.names():
                for p in adapter_parameters(engines.generator.model, name):
                    p.add_(torch.randn(p.shape, generator=g).to(p.dtype) * 0.01)

    engines.generator.worker.run_sync(fill)


# =========================================================================== generation
async def run_variant(generate: Any, reqs: list[Req], rows: list[str | None], concurrency: int) -> float:
    """tok/s of ``reqs`` (request i with adapter ``rows[i]``) through ``generate``, ``concurrency`` at a time."""
    from agentjet.engines.base import SamplingParams

    adapter_of = {id(r): a for r, a in zip(reqs, rows, strict=True)}

    async def submit(r: Req) -> int:
        res = await generate(r.prompt_ids, SamplingParams(temperature=1.0, max_tokens=r.max_tokens, seed=r.seed),
                             adapter=adapter_of[id(r)])
        return len(res.token_ids)

    tokens, seconds = await closed_loop(submit, reqs, concurrency)
    expected = sum(r.max_tokens for r in reqs)
    if tokens != expected:
        raise RuntimeError(f"generated {tokens} tokens, expected {expected}")
    return tokens / seconds


async def bench_generation(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    from agentjet.layouts import embedded_engine
    from agentjet.layouts.adapters import adapter_engines

    gen_settings, learner, placement = settings(args)
    names = adapter_names(args.adapters)
    engines = adapter_engines(path, names, gen_settings, learner, placement=placement)
    engines.generator.rules.stop_ids = frozenset()  # no EOS: every request generates exactly its max_tokens
    randomise_adapters(engines, args.seed)
    runner = engines.generator.core.runner
    assert runner is not None
    plain = embedded_engine(path, gen_settings, learner, placement=placement) if args.reference else None
    if plain is not None:
        plain.generator.rules.stop_ids = frozenset()
    special = set(engines.tokenizer.all_special_ids)
    n = args.concurrency * args.requests_per_client
    reqs = make_requests(len(engines.tokenizer), special, n, args.prompt_tokens, args.new_tokens, args.seed)
    mixed_label = f"{args.adapters} adapters mixed"

    async def adapters_generate(ids: list[int], sampling: Any, adapter: str | None) -> Any:
        return await engines.generator.generate(ids, sampling, adapter=adapter)

    async def plain_generate(ids: list[int], sampling: Any, adapter: str | None) -> Any:
        assert plain is not None
        return await plain.generate(ids, sampling)

    round_robin: list[str | None] = [names[i % len(names)] for i in range(n)]
    peft_label = f"{args.adapters} adapters mixed, PEFT adapter_names (reference)"
    # label -> (generate, each request's adapter, through PEFT's adapter_names)
    variants: dict[str, tuple[Any, list[str | None], bool]] = {
        "1 adapter (all rows A)": (adapters_generate, ["A"] * n, False),
        mixed_label: (adapters_generate, round_robin, False),
    }
    if args.reference:
        variants[peft_label] = (adapters_generate, round_robin, True)
    if plain is not None:
        variants["single-LoRA engine (reference)"] = (plain_generate, [None] * n, False)

    async def timed(label: str, subset: list[Req]) -> float:
        fn, rows, peft = variants[label]
        runner.adapters.prefer_peft_rows = peft  # the engine is idle between runs: the worker reads it at the next forward
        try:
            return await run_variant(fn, subset, rows[: len(subset)], args.concurrency)
        finally:
            runner.adapters.prefer_peft_rows = False

    try:
        for label in variants:  # warm-up: allocation, first-call costs
            await timed(label, reqs[: args.concurrency])
        tok_s: dict[str, list[float]] = {k: [] for k in variants}
        before = dict(engines.generator.stats)
        for r in range(args.repeats):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))  # taking turns: drift hits all
            for label in order:
                tok_s[label].append(await timed(label, reqs))
                print(f"  repeat {r}: {label}: {tok_s[label][-1]:.1f} tok/s", flush=True)
        stats = {k: v - before.get(k, 0) for k, v in engines.generator.stats.items() if isinstance(v, int | float)}
        how = engines.describe()["mixed_adapter_batches"]
    finally:
        await engines.close()
        if plain is not None:
            await plain.close()
    median = {k: statistics.median(v) for k, v in tok_s.items()}
    one = median["1 adapter (all rows A)"]
    return {"concurrency": args.concurrency, "requests": n, "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens, "repeats": args.repeats, "adapters": names, "tok_s": median,
            "tok_s_all": tok_s, "mixed_over_one": median[mixed_label] / one, "target": GEN_TARGET,
            "mixed_label": mixed_label, "mixed_adapter_batches": how,
            "peft_over_one": median[peft_label] / one if peft_label in median else None,
            "decode_steps": stats.get("decode_steps"),
            "mixed_adapter_steps": stats.get("mixed_adapter_steps"),
            "mean_rows_per_decode_step": stats["decode_rows"] / max(stats["decode_steps"], 1)}


# =========================================================================== memory (one child per configuration)
def child_memory(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    """In a fresh process: the base with ``args.child_adapters`` adapters, each generated with and stepped once;
    the RSS after."""
    import psutil

    from agentjet.engines.base import SamplingParams, TrainSample
    from agentjet.layouts.adapters import adapter_engines
    from agentjet.runtime.blocking import run_blocking

    gen_settings, learner, placement = settings(args)
    engines = adapter_engines(path, adapter_names(args.child_adapters), gen_settings, learner, placement=placement)
    prompt = make_requests(len(engines.tokenizer), set(engines.tokenizer.all_special_ids), 1, args.prompt_tokens,
                           32, args.seed)[0].prompt_ids
    sampling = SamplingParams(temperature=1.0, max_tokens=32, seed=1)

    async def all_at_once() -> list[Any]:  # one mixed batch: every adapter's row in it
        return list(await asyncio.gather(*[engines.engine(n).generate(prompt, sampling) for n in engines.names()]))

    async def each_once() -> None:
        for name, res in zip(engines.names(), await all_at_once(), strict=True):
            n = len(res.token_ids)
            sample = TrainSample(prompt + res.token_ids, [0] * len(prompt) + [1] * n,
                                 [0.0] * len(prompt) + res.logprobs, [0.0] * len(prompt) + [1.0] * n)
            await engines.engine(name).train_step([sample, sample])
        await all_at_once()  # the stepped weights: the per-row LoRA's stacked copies are made again

    run_blocking(each_once())
    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # give back what the allocator holds unused: the live RSS
    rss = psutil.Process().memory_info().rss
    runner = engines.generator.core.runner
    stacked = runner.adapters.row_lora.stacked_bytes if runner is not None and runner.adapters.row_lora is not None else 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    trained = {name: len(engines.engine(name).learner.params) for name in engines.names()}
    adapter_bytes = sum(p.numel() * p.element_size() for name in engines.names()
                        for p in engines.engine(name).learner.params)
    run_blocking(engines.close())
    return {"adapters": args.child_adapters, "rss_mib": rss / 2**20, "peak_rss_mib": peak / 2**20,
            "adapter_tensors": trained, "adapter_weights_mib": adapter_bytes / 2**20,
            "stacked_copy_mib": stacked / 2**20}


def bench_memory(args: argparse.Namespace) -> dict[str, Any]:
    rows = {}
    for n in (1, args.adapters):
        cmd = [sys.executable, __file__, "--child-adapters", str(n), "--model", args.model, "--device", args.device,
               "--lora-rank", str(args.lora_rank), "--concurrency", str(args.concurrency),
               "--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=os.environ.copy())
        if out.returncode != 0:
            raise RuntimeError(f"memory child ({n} adapters) failed:\n{out.stderr[-3000:]}")
        rows[n] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  base + {n} adapter(s): RSS {rows[n]['rss_mib']:.0f} MiB", flush=True)
    one, many = rows[1], rows[args.adapters]
    return {"one": one, "many": many, "rss_ratio": many["rss_mib"] / one["rss_mib"],
            "peak_rss_ratio": many["peak_rss_mib"] / one["peak_rss_mib"], "target": MEM_TARGET}


# =========================================================================== output
def render(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    gen, mem, m = result["generation"], result["memory"], result["machine"]
    table = Table(title=f"LoRA adapters on one base: {result['model']} (rank {result['lora_rank']}) on "
                        f"{m['device_name']} ({m['device']}), {gen['concurrency']} concurrent, "
                        f"{gen['prompt_tokens']}-token prompts, {gen['new_tokens']} new tokens; median of "
                        f"{gen['repeats']}")
    for col in ("measure", "value", "target"):
        table.add_column(col, justify="right")
    for name, value in gen["tok_s"].items():
        table.add_row(f"tok/s, {name}", f"{value:.1f}", "")
    table.add_row(f"{gen['mixed_label']} / 1 adapter", f"{gen['mixed_over_one']:.2f}x", f">= {GEN_TARGET}x")
    if gen.get("peft_over_one") is not None:
        table.add_row("  the same through PEFT's adapter_names", f"{gen['peft_over_one']:.2f}x", "")
    table.add_row("RSS, base + 1 adapter (stepped)", f"{mem['one']['rss_mib']:.0f} MiB", "")
    table.add_row(f"RSS, base + {mem['many']['adapters']} adapters (each stepped)", f"{mem['many']['rss_mib']:.0f} MiB",
                  "")
    table.add_row(f"RSS ratio {mem['many']['adapters']} / 1", f"{mem['rss_ratio']:.3f}x", f"<= {MEM_TARGET}x")
    table.add_row("peak RSS ratio", f"{mem['peak_rss_ratio']:.3f}x", "")
    Console().print(table)


def parse_args() -> argparse.Namespace:
    from agentjet.models import DEFAULT_MODEL

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL, help="a model name or a local HF directory")
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--device", default="cpu", help="cpu (the default), or cuda (the adapters run eagerly there too)")
    p.add_argument("--adapters", type=int, default=4, help="adapters mixed (and in the memory comparison)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-reference", dest="reference", action="store_false",
                   help="skip the reference rows (PEFT's adapter_names, the single-LoRA engine)")
    p.add_argument("--quick", action="store_true", help="a smoke run (short requests, one repeat)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: one per core)")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--child-adapters", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.new_tokens, args.repeats, args.requests_per_client = 16, 1, 1
    if not 1 <= args.adapters <= len(ADAPTER_NAMES):
        p.error(f"--adapters must be in [1, {len(ADAPTER_NAMES)}]")
    return args


def main() -> None:
    from agentjet.models import resolve_model

    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    if args.child_adapters is not None:
        print(json.dumps(child_memory(args, path)))
        return
    device = torch.device(args.device)
    result: dict[str, Any] = {"benchmark": "adapters", "model": args.model, "lora_rank": args.lora_rank,
                              "machine": machine(device), "args": {k: str(v) for k, v in vars(args).items()}}
    print("generation ...", flush=True)
    result["generation"] = asyncio.run(bench_generation(args, path))
    print("memory ...", flush=True)
    result["memory"] = bench_memory(args)
    render(result)
    out = args.output or RESULTS / f"adapters_{device.type}{'_quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
