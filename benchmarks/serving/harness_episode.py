"""A harness's episode through ``ajet server`` with the engine's kept prefixes on and off, in one run.

    .venv/bin/python benchmarks/serving/harness_episode.py                     # CPU: SmolLM2-135M-Instruct, 4 episodes
    .venv/bin/python benchmarks/serving/harness_episode.py --turns 3 --repeats 1 --system-lines 40   # short

An agent harness (Claude Code here: Anthropic's Messages API) resends its whole history on every call: a long
system prompt (its tools and rules, ``--system-lines`` lines, about 17 tokens each), then every turn so far. Each
of ``--concurrency`` episodes makes ``--turns`` calls; each call's user turn carries a tool result of
``--result-words`` words, and the reply (``--max-tokens``, temperature 1, a seed each) goes back into the history.
Two servers run side by side, alike but for ``generator.prefix_cache_tokens`` (0, and the default); rounds
alternate which goes first. Per round and server: the wall time of all episodes, the calls per second, and, from the
server's Prometheus counters, the prompt tokens the kept prefixes spared. ``speedup`` is the median over rounds of
off's wall time over on's. JSON with commit and machine in benchmarks/results/harness_episode_<device>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # workloads.py

from agentjet.runtime.omp import prefer_passive_openmp  # noqa: E402

prefer_passive_openmp()

# isort: split
import httpx  # noqa: E402
import torch  # noqa: E402
from workloads import MODEL_ROOT, RESULTS, ROOT, model_path  # noqa: E402

from agentjet.runtime import provenance  # noqa: E402

ADMIN = "bench-admin-token-0123456789"
WORDS = ["file", "line", "read", "path", "value", "error", "test", "build", "return", "count", "list", "name"]


def system_prompt(lines: int) -> str:
    return "\n".join(f"Tool {i}: reads the file at the given path and returns its lines, numbered from one."
                     for i in range(lines))


def tool_result(episode: int, turn: int, words: int) -> str:
    return " ".join(WORDS[(episode * 7 + turn * 3 + k) % len(WORDS)] for k in range(words))


async def episode(http: httpx.AsyncClient, i: int, round_: int, args: argparse.Namespace) -> tuple[int, int]:
    """One episode's calls, one after the other; (prompt tokens, calls)."""
    ep = (await http.post("/swarm/v1/episodes", json={"client_id": "bench", "task_id": f"t{i}"})).json()
    headers = {"Authorization": f"Bearer {ep['api_key']}"}
    system, history, prompt_tokens = system_prompt(args.system_lines), [], 0
    for turn in range(args.turns):
        history.append({"role": "user", "content": f"Result of the last tool:\n{tool_result(i, turn, args.result_words)}"})
        body = {"model": "bench", "system": system, "messages": history, "max_tokens": args.max_tokens,
                "temperature": 1.0, "seed": 10_000 * round_ + 100 * i + turn}
        r = await http.post("/v1/messages", json=body, headers=headers)
        r.raise_for_status()
        reply = r.json()
        prompt_tokens += int(reply["usage"]["input_tokens"])
        history.append({"role": "assistant", "content": "".join(b.get("text", "") for b in reply["content"]) or "ok"})
    await http.post(f"/swarm/v1/episodes/{ep['episode_id']}/abort", json={"reason": "benchmark"}, headers=headers)
    return prompt_tokens, args.turns


def reused_tokens(http: httpx.Client) -> int:
    text = http.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
    found = re.search(r"^agentjet_generator_prefix_reused_tokens_total (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else 0


async def one_round(url: str, round_: int, args: argparse.Namespace) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=30) as sync:
        before = reused_tokens(sync)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(1800.0)) as http:
        t0 = time.perf_counter()
        done = await asyncio.gather(*(episode(http, i, round_, args) for i in range(args.concurrency)))
        seconds = time.perf_counter() - t0
    with httpx.Client(base_url=url, timeout=30) as sync:
        reused = reused_tokens(sync) - before
    prompt, calls = sum(p for p, _ in done), sum(c for _, c in done)
    return {"round": round_, "seconds": seconds, "calls": calls, "calls_s": calls / seconds,
            "prompt_tokens": prompt, "reused_tokens": reused, "reused_share": reused / prompt}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--system-lines", type=int, default=150)
    p.add_argument("--result-words", type=int, default=250)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    device = torch.device(args.device)

    from agentjet.runtime.launch import ServerProcess, free_port
    from agentjet.settings import GeneratorSettings, ServerConfig

    path = model_path(args.model, torch.bfloat16 if device.type == "cuda" else torch.float32, MODEL_ROOT)
    arms = {"off": 0, "on": GeneratorSettings().prefix_cache_tokens}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        servers = {}
        for arm, budget in arms.items():
            config = ServerConfig.model_validate({
                "model": str(path), "served_model_name": "bench", "port": free_port(), "data_dir": f"{tmp}/{arm}",
                "log_level": "WARNING", "lease_seconds": 3600, "placement": {"device": args.device},
                "generator": {"max_batch_size": args.concurrency, "prefix_cache_tokens": budget},
                "admin_token": ADMIN, "training": {"group_size": 1024, "batch_groups": 1024, "min_group_size": 1024}})
            servers[arm] = ServerProcess(f"bench-{arm}", config, Path(tmp) / f"{arm}.log", Path(tmp) / f"{arm}.yaml")
        try:
            for server in servers.values():
                server.start()
            for server in servers.values():
                server.wait_ready(600)
            for rep in range(args.repeats):
                for arm in (["off", "on"] if rep % 2 == 0 else ["on", "off"]):
                    row = {"arm": arm, **asyncio.run(one_round(servers[arm].url, rep, args))}
                    rows.append(row)
                    print(f"  {arm:3s} round {rep}: {row['seconds']:7.1f} s  {row['calls_s']:.3f} calls/s  "
                          f"{row['prompt_tokens']} prompt tokens, {row['reused_share']:.0%} reused", file=sys.stderr,
                          flush=True)
        finally:
            for server in servers.values():
                server.stop(grace=30)

    def of(arm: str) -> list[dict[str, Any]]:
        return [r for r in rows if r["arm"] == arm]

    speedups = [off["seconds"] / on["seconds"] for off, on in zip(of("off"), of("on"), strict=True)]
    summary = {"speedup": statistics.median(speedups), "speedups": speedups,
               "seconds": {arm: statistics.median(r["seconds"] for r in of(arm)) for arm in arms},
               "calls_s": {arm: statistics.median(r["calls_s"] for r in of(arm)) for arm in arms},
               "reused_share_on": statistics.median(r["reused_share"] for r in of("on"))}
    print(f"kept prefixes: {summary['speedup']:.2f}x the episodes' speed ({summary['seconds']['off']:.1f} s -> "
          f"{summary['seconds']['on']:.1f} s), {summary['reused_share_on']:.0%} of prompt tokens reused")
    out = args.output or RESULTS / f"harness_episode_{device.type}.json"
    out.write_text(json.dumps({"benchmark": "harness_episode", "commit": provenance.git_commit(ROOT),
                               "machine": provenance.machine(), "device": provenance.device(), "args": vars(args),
                               "summary": summary, "rows": rows}, indent=2, default=str) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
