"""Pilot for the multi-turn agent task: the base model's success on candidate workflows, through a real
swarm server (SmolLM2-135M-Instruct on the HF engine, in this process), as eval episodes (never trained).

Candidates, on the same two-digit +/- tasks (``agentjet.tasks.calculator``):
- ``tool``: the calculator tool loop: call the tool, read the result, answer (the first answer is final);
- ``tool_checker``: the same, and a wrong answer gets the checker's hint and another turn
  (``calculator.rollout``, up to 4 calls);
- ``retry``: no tool; a checker answers a wrong reply with "higher"/"lower" and the agent tries again
  (3 attempts).

    .venv/bin/python benchmarks/agent_task_pilot.py --n 48

Prints success, turns per episode, the share of episodes that called the tool, calls per training sample
(timeline merging) and a few transcripts; writes benchmarks/results/agent_task_pilot.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import agentjet  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "agent_task_pilot.json"


async def retry_rollout(task: dict[str, Any], ep: Any, sampling: dict[str, Any], log: list[str]) -> float:
    from agentjet.tasks import calculator

    client = ep.openai()
    messages = [task["messages"][1]]  # the question only: no tool instructions
    target = int(task["answer"])
    for attempt in range(3):
        reply = await client.chat.completions.create(model="agent", messages=messages, **sampling)
        text = reply.choices[0].message.content or ""
        log.append(text)
        if calculator.reward(task, text):
            return 1.0
        nums = calculator._NUM.findall(text)
        hint = "Give a number." if not nums else ("Too low." if int(nums[-1]) < target else "Too high.")
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": f"{hint} Try again: reply with only the number."}]
        del attempt
    return 0.0


async def tool_rollout(task: dict[str, Any], ep: Any, sampling: dict[str, Any], log: list[str],
                       checker: bool = False) -> float:
    from agentjet.tasks import calculator

    client = ep.openai()
    messages = [dict(m) for m in task["messages"]]
    for _ in range(calculator.MAX_TURNS):
        reply = await client.chat.completions.create(model="agent", messages=messages, tools=calculator.TOOLS,
                                                     **sampling)
        msg = reply.choices[0].message
        log.append(f"{msg.content!r} calls={[tc.function.arguments for tc in msg.tool_calls or []]}")
        if not msg.tool_calls:
            text = msg.content or ""
            if calculator.reward(task, text) or not checker:
                return calculator.reward(task, text)
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": calculator.feedback(task, text)}]
            continue
        messages.append({"role": "assistant", "content": msg.content or "",
                         "tool_calls": [tc.model_dump() for tc in msg.tool_calls]})
        for tc in msg.tool_calls:
            result = calculator.run_tool(tc)
            log.append(f"tool -> {result}")
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": result})
    return 0.0


async def pilot(url: str, variant: str, tasks: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    from agentjet.client.client import SwarmClient
    from agentjet.client.runner import run_workflow
    from agentjet.tasks import calculator

    logs: dict[str, list[str]] = {}
    async def workflow(task: dict[str, Any], ep: Any) -> float:
        log = logs.setdefault(task["task_id"], [])
        if variant == "retry":
            return await retry_rollout(task, ep, dict(calculator.SAMPLING), log)
        return await tool_rollout(task, ep, dict(calculator.SAMPLING), log, checker=variant == "tool_checker")

    t0 = time.monotonic()
    async with SwarmClient(url, client_id=f"pilot-{variant}") as client:
        s = await run_workflow(client, workflow, tasks, group_size=1, concurrency=concurrency, eval=True)
    tool_used = sum(any(line.startswith("tool ->") for line in lg) for lg in logs.values())
    return {"variant": variant, "episodes": s.episodes, "failed": s.failed, "success": s.mean_reward,
            "calls": s.calls, "samples": s.samples, "calls_per_episode": s.calls / max(s.episodes - s.failed, 1),
            "merge_ratio": s.merge_ratio, "tool_used_share": tool_used / max(len(logs), 1),
            "seconds": time.monotonic() - t0, "transcripts": dict(list(logs.items())[:6])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--n", type=int, default=48)
    p.add_argument("--variants", nargs="+", default=["tool", "tool_checker", "retry"])
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--tag", default="", help="a label for this system prompt / setting (results are merged by it)")
    args = p.parse_args()

    from agentjet.engines.hf import HFEngine
    from agentjet.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.app import BackgroundServer
    from agentjet.settings import EngineSettings, ServerConfig
    from agentjet.tasks import calculator

    tasks = calculator.generate_tasks("train", args.n, seed=123)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        engine = HFEngine(args.model, EngineSettings(max_batch_size=args.concurrency))
        cfg = ServerConfig(model=args.model, port=free_port(), data_dir=Path(tmp),
                           engine=EngineSettings(max_batch_size=args.concurrency))
        with BackgroundServer(SwarmServer(cfg, engine)) as bg:
            for v in args.variants:
                r = asyncio.run(pilot(bg.url, v, tasks, args.concurrency))
                r.update(tag=args.tag, system=calculator.SYSTEM)
                results.append(r)
                print(f"{args.tag or '-'} {v}: success {r['success']:.3f} over {r['episodes']} episodes, {r['calls_per_episode']:.2f} "
                      f"calls/episode, tool used in {r['tool_used_share']:.0%}, calls per sample "
                      f"{r['merge_ratio']:.2f}, {r['seconds']:.0f}s", flush=True)
                for tid, lines in list(r["transcripts"].items())[:3]:
                    print(f"  {tid}: " + " | ".join(x[:90] for x in lines))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    old = json.loads(OUT.read_text())["results"] if OUT.exists() else []
    keep = [r for r in old if (r.get("tag", ""), r["variant"]) not in {(x["tag"], x["variant"]) for x in results}]
    OUT.write_text(json.dumps({"machine": platform.machine(), "device": "cpu", "commit": commit, "model": args.model,
                               "n": args.n, "sampling": calculator.SAMPLING, "results": keep + results}, indent=2))


if __name__ == "__main__":
    main()
