"""Calibration pilot for the tool-use task (``agentjet.tasks.lookup``): the base model's success and tool use
per prompt variant, through a real swarm server (the HF engine, in this process), as eval episodes (never
trained on).

Variants: a prompt from ``lookup.PROMPTS`` (``fewshot``: a worked episode in the messages; ``example``: the
same in the system prompt; ``plain``) and the checker on or off (``--checker``: an answer without the code
gets "That is not the code. Call the lookup tool ..." and another turn).

    flock /tmp/aj-cpu.lock .venv/bin/python benchmarks/lookup_pilot.py --prompts fewshot example --n 32

Prints, per variant: success, the share of episodes with any tool call and with a correct one (the right
tool, valid arguments, the asked item), turns per episode, calls per training sample, tokens per episode,
episodes per minute, and a few transcripts. Merges each row into benchmarks/results/lookup_pilot.json (by
variant and tag).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from agentjet.runtime import prefer_passive_openmp

prefer_passive_openmp()  # before torch loads, as in the server

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "lookup_pilot.json"


async def pilot(url: str, prompt: str, checker: bool, args: argparse.Namespace) -> dict[str, Any]:
    from agentjet.client.client import SwarmClient
    from agentjet.client.runner import run_workflow
    from agentjet.tasks import lookup

    tasks = [{**t, "index": i} for i, t in enumerate(lookup.generate_tasks(args.split, args.n, seed=0,
                                                                           prompt=prompt))]
    traces = {t["task_id"]: lookup.EpisodeTrace() for t in tasks}
    sampling = {**lookup.EVAL_SAMPLING, "max_tokens": args.max_tokens}

    async def workflow(task: dict[str, Any], ep: Any) -> float:
        params = {**sampling, "seed": sampling["seed"] + task["index"]}
        return await lookup.rollout(task, ep, params, checker=checker, max_turns=args.max_turns,
                                    trace=traces[task["task_id"]])

    t0 = time.monotonic()
    async with SwarmClient(url, client_id=f"pilot-{prompt}") as client:
        tokens0 = (await client.status()).throughput["generated_tokens"]
        s = await run_workflow(client, workflow, tasks, group_size=1, concurrency=args.concurrency, eval=True)
        tokens = (await client.status()).throughput["generated_tokens"] - tokens0
    seconds = time.monotonic() - t0
    done = max(s.episodes - s.failed, 1)
    row = lookup.tool_use_summary(tasks, [traces[t["task_id"]] for t in tasks])
    return {"prompt": prompt, "checker": checker, **row, "failed": s.failed, "calls_per_sample": s.merge_ratio,
            "generated_tokens_per_episode": tokens / done, "episodes_per_min": 60 * done / seconds,
            "seconds": seconds,
            "transcripts": {t["item"] + " = " + t["answer"]: traces[t["task_id"]].transcript for t in tasks[:6]}}


def main() -> None:
    from agentjet.tasks import lookup

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--n", type=int, default=lookup.EVAL_TABLES)
    p.add_argument("--prompts", nargs="+", default=list(lookup.PROMPTS), choices=list(lookup.PROMPTS))
    p.add_argument("--checker", choices=["on", "off", "both"], default="on" if lookup.CHECKER else "off")
    p.add_argument("--split", default="eval", choices=lookup.SPLITS)
    p.add_argument("--max-turns", type=int, default=lookup.MAX_TURNS)
    p.add_argument("--max-tokens", type=int, default=lookup.SAMPLING["max_tokens"])
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--tag", default="", help="a label for this setting (rows merge by tag, prompt, checker)")
    args = p.parse_args()

    from agentjet.launch import free_port
    from agentjet.layouts import embedded_engine
    from agentjet.provenance import git_commit, machine
    from agentjet.server import SwarmServer
    from agentjet.server.app import BackgroundServer
    from agentjet.settings import GeneratorSettings, ServerConfig

    checkers = {"on": [True], "off": [False], "both": [True, False]}[args.checker]
    setting = {"tag": args.tag, "split": args.split, "n": args.n, "max_turns": args.max_turns,
               "max_tokens": args.max_tokens, "concurrency": args.concurrency,
               "temperature": lookup.EVAL_SAMPLING["temperature"], "commit": git_commit(),
               "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        engine = embedded_engine(args.model, GeneratorSettings(max_batch_size=args.concurrency))
        cfg = ServerConfig(model=args.model, port=free_port(), data_dir=Path(tmp),
                           generator=GeneratorSettings(max_batch_size=args.concurrency))
        with BackgroundServer(SwarmServer(cfg, engine)) as bg:
            for prompt in args.prompts:
                for checker in checkers:
                    r = {**asyncio.run(pilot(bg.url, prompt, checker, args)), **setting}
                    rows.append(r)
                    print(f"{args.tag or '-'} {prompt} checker={'on' if checker else 'off'}: success "
                          f"{r['success']:.3f}, tool call {r['tool_call_share']:.0%}, correct call "
                          f"{r['correct_call_share']:.0%}, unparsed {r['unparsed_call_share']:.0%}, "
                          f"{r['turns_per_episode']:.2f} turns, {r['calls_per_sample']:.2f} calls/sample, "
                          f"{r['generated_tokens_per_episode']:.0f} tok/episode, {r['episodes_per_min']:.1f} ep/min, "
                          f"{r['seconds']:.0f}s", flush=True)
                    for head, lines in list(r["transcripts"].items())[:3]:
                        print(f"  {head}: " + " | ".join(x[:100] for x in lines), flush=True)
    old = json.loads(OUT.read_text())["results"] if OUT.exists() else []
    new_keys = {(r["tag"], r["prompt"], r["checker"]) for r in rows}
    keep = [r for r in old if (r["tag"], r["prompt"], r["checker"]) not in new_keys]
    OUT.write_text(json.dumps({"machine": machine(), "device": "cpu", "model": args.model, "results": keep + rows},
                              indent=2))


if __name__ == "__main__":
    main()
