"""Generation throughput through ``ajet server``, black box, against the same generations on an engine in this
process (engine-direct), in one run.

    .venv/bin/python benchmarks/serving/server_throughput.py                     # CPU: SmolLM2-135M-Instruct, c8 and c16
    .venv/bin/python benchmarks/serving/server_throughput.py --device cuda --model 135m   # c1, c8, c64

Server side: ``ajet server`` in its own process (continuous batching, ``--max-batch-size`` = the largest
concurrency); ``c`` clients each begin their own episode and send one chat call (temperature 1, a seed each,
``--max-tokens`` new tokens), all at once; tok/s = completion tokens (from ``usage``) / the wall time from the
first call to the last reply. The episodes are aborted afterwards (nothing is trained). Direct side: an engine
with the same settings in this process, ``engine.generate`` on the prompt ids the server's chat template makes
from the same messages, with the same sampling parameters and seeds, all at once. Both sides generate the same
tokens (checked: the completion-token totals are equal), so the ratio server / direct is the server's cost.
Rounds alternate server and direct; figures are medians. Target: >= 0.9x at c64 (CPU: c8 and c16).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # workloads.py

from agentjet.runtime.blocking import run_blocking  # noqa: E402
from agentjet.runtime.omp import prefer_passive_openmp  # noqa: E402

prefer_passive_openmp()

# isort: split
import httpx  # noqa: E402
import torch  # noqa: E402
from workloads import MODEL_ROOT, RESULTS, machine, model_path  # noqa: E402

TOPICS = ["a lighthouse keeper", "how a refrigerator works", "the printing press", "learning the guitar",
          "trees in cities", "photosynthesis", "a medieval blacksmith", "the ocean at night"]


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Write a long, detailed text about {TOPICS[i % len(TOPICS)]} (#{i})."}]


async def through_server(url: str, c: int, max_tokens: int, round_: int) -> tuple[int, float]:
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(900.0),
                                 limits=httpx.Limits(max_connections=c + 8)) as http:
        eps = [(await http.post("/swarm/v1/episodes", json={"client_id": "bench", "task_id": f"t{i}"})).json()
               for i in range(c)]

        async def call(i: int, ep: dict) -> int:
            body = {"model": "bench", "messages": messages(i), "max_tokens": max_tokens, "temperature": 1.0,
                    "seed": 1000 * round_ + i}
            r = await http.post("/v1/chat/completions", json=body,
                                headers={"Authorization": f"Bearer {ep['api_key']}"})
            r.raise_for_status()
            return int(r.json()["usage"]["completion_tokens"])

        t0 = time.perf_counter()
        tokens = await asyncio.gather(*(call(i, ep) for i, ep in enumerate(eps)))
        elapsed = time.perf_counter() - t0
        for ep in eps:
            await http.post(f"/swarm/v1/episodes/{ep['episode_id']}/abort", json={"reason": "benchmark"},
                            headers={"Authorization": f"Bearer {ep['api_key']}"})
    return sum(tokens), elapsed


async def direct(engine: Any, formatter: Any, c: int, max_tokens: int, round_: int) -> tuple[int, float]:
    from agentjet.engines.base import SamplingParams

    prompts = [formatter.prompt_ids(messages(i), None) for i in range(c)]
    t0 = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=1.0, max_tokens=max_tokens,
                                                                       seed=1000 * round_ + i))
                                     for i, p in enumerate(prompts)))
    return sum(len(r.token_ids) for r in results), time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default=None, help="smollm2-135m-instruct (CPU default), 135m or 1.7b (random "
                   "weights, SmolLM2 shapes; CUDA default 135m)")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=None)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    cuda = args.device.startswith("cuda")
    args.model = args.model or ("135m" if cuda else "smollm2-135m-instruct")
    args.concurrency = args.concurrency or ([1, 8, 64] if cuda else [8, 16])
    device = torch.device(args.device)

    from agentjet.layouts import embedded_engine
    from agentjet.runtime.launch import ServerProcess, free_port
    from agentjet.server.episodes.chat import ChatFormatter
    from agentjet.settings import GeneratorSettings, PlacementSettings, ServerConfig

    path = model_path(args.model, torch.bfloat16 if cuda else torch.float32, MODEL_ROOT)
    generator, placement = {"max_batch_size": max(args.concurrency)}, {"device": args.device}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = ServerConfig.model_validate({
            "model": str(path), "served_model_name": "bench", "port": free_port(), "data_dir": tmp,
            "log_level": "WARNING", "lease_seconds": 3600, "generator": generator,
            "placement": placement,
            "training": {"group_size": 1024, "batch_groups": 1024, "min_group_size": 1024}})
        server = ServerProcess("bench", config, Path(tmp) / "server.log", Path(tmp) / "server.yaml").start()
        engine = embedded_engine(path, GeneratorSettings(**generator), placement=PlacementSettings(**placement))
        formatter = ChatFormatter(engine.tokenizer)
        try:
            server.wait_ready(600)
            url = server.url
            for c in args.concurrency:
                # untimed, both sides: a batch of c rows captures its CUDA graphs on first use
                asyncio.run(through_server(url, c, 8, 98))
                asyncio.run(direct(engine, formatter, c, 8, 98))
                for rep in range(args.repeats):
                    sides = ("server", "direct") if rep % 2 == 0 else ("direct", "server")
                    for side in sides:
                        if side == "server":
                            tokens, secs = asyncio.run(through_server(url, c, args.max_tokens, rep))
                        else:
                            tokens, secs = asyncio.run(direct(engine, formatter, c, args.max_tokens, rep))
                        rows.append({"side": side, "concurrency": c, "repeat": rep, "tokens": tokens,
                                     "seconds": secs, "tok_s": tokens / secs})
                        print(f"  {side:6s} c={c:<3d} {tokens:6d} tokens {secs:7.2f} s {tokens / secs:8.1f} tok/s",
                              file=sys.stderr, flush=True)
        finally:
            server.stop(grace=30)
            run_blocking(engine.close())

    summary = {}
    for c in args.concurrency:
        per = {s: [r for r in rows if r["side"] == s and r["concurrency"] == c] for s in ("server", "direct")}
        ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(per["server"], per["direct"], strict=True)]
        summary[c] = {"server_tok_s": statistics.median(r["tok_s"] for r in per["server"]),
                      "direct_tok_s": statistics.median(r["tok_s"] for r in per["direct"]),
                      "ratio": statistics.median(ratios), "ratios": ratios,
                      "same_tokens": [a["tokens"] == b["tokens"] for a, b in
                                      zip(per["server"], per["direct"], strict=True)]}
    from rich.console import Console
    from rich.table import Table

    m = machine(device)
    table = Table(title=f"Through ajet server vs engine-direct: {args.model} on {m['device_name']} "
                        f"({args.device}), {args.max_tokens} max tokens, median of {args.repeats}")
    for col in ("clients (one episode, one call each)", "server tok/s", "direct tok/s", "server / direct", "target"):
        table.add_column(col, justify="right")
    for c, s in summary.items():
        table.add_row(str(c), f"{s['server_tok_s']:.1f}", f"{s['direct_tok_s']:.1f}", f"{s['ratio']:.2f}x",
                      ">= 0.9x" if c >= 8 else "")
    Console().print(table)
    out = args.output or RESULTS / f"server_throughput_{device.type}_{args.model.replace('.', '')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": m, "args": {k: v for k, v in vars(args).items()}, "rows": rows,
                               "summary": summary}, indent=2, default=str) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
