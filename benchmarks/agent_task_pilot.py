"""Pilot for the multi-turn agent task: the base model's success on candidate workflows and settings, through
a real swarm server (SmolLM2-135M-Instruct on the HF engine, in this process), as eval episodes (never trained).

Workflows, on the arithmetic tasks of ``agentjet.tasks.calculator``:
- ``tool_checker`` (the task's ``rollout``): a calculator tool loop; a wrong answer gets the checker's hint
  ("Too high/low, use the calculator") and another turn, up to ``--max-turns`` calls;
- ``tool``: the same, but the first answer is final;
- ``retry``: no tool; the checker's hint and another attempt (3 attempts).

Settings: the operand range (``--lo/--hi``), the operators (``--ops``), turns, max tokens per call, the
system prompt (``--system``: the task's, ``plain``, ``example``) and the split (default: the held-out one).

    .venv/bin/python benchmarks/agent_task_pilot.py --tag d1-9-example --lo 1 --hi 9 --system example

Prints success, calls per episode, the share of episodes that called the tool, generated tokens per episode,
episodes per minute and a few transcripts; merges the row into benchmarks/results/agent_task_pilot.json (by
tag and workflow).
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

from agentjet.runtime import prefer_passive_openmp

prefer_passive_openmp()  # before torch loads, as in the server

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
                       checker: bool = False, max_turns: int = 4) -> float:
    from agentjet.tasks import calculator

    client = ep.openai()
    messages = [dict(m) for m in task["messages"]]
    for _ in range(max_turns):
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


SYSTEMS = {
    # the task's own system prompt (agentjet.tasks.calculator.SYSTEM)
    "task": None,
    # the first pilot's prompt (no worked example)
    "plain": "You are a careful assistant. Use the calculator tool for arithmetic, then reply with only the number.",
    # with a worked example (the prompt of the first recorded agent run)
    "example": ("You are a careful assistant. Use the calculator tool for arithmetic, then reply with only the "
                'number.\nExample: for "What is 12 + 30?" reply <tool_call>{"name": "calculator", "arguments": '
                '{"expression": "12 + 30"}}</tool_call>, read the result 42, then reply 42.'),
}


def make_tasks(args: argparse.Namespace) -> list[dict[str, Any]]:
    from agentjet.tasks import calculator

    tasks = calculator.generate_tasks(args.split, args.n, seed=123, operands=range(args.lo, args.hi + 1),
                                      ops=tuple(args.ops))
    system = SYSTEMS[args.system]
    if system is not None:
        tasks = [{**t, "messages": [{"role": "system", "content": system}, *t["messages"][1:]]} for t in tasks]
    return tasks


async def pilot(url: str, variant: str, tasks: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    from agentjet.client.client import SwarmClient
    from agentjet.client.runner import run_workflow
    from agentjet.tasks import calculator

    sampling = {**calculator.SAMPLING, "max_tokens": args.max_tokens}
    logs: dict[str, list[str]] = {}

    async def workflow(task: dict[str, Any], ep: Any) -> float:
        log = logs.setdefault(task["task_id"], [])
        if variant == "retry":
            return await retry_rollout(task, ep, sampling, log)
        return await tool_rollout(task, ep, sampling, log, checker=variant == "tool_checker",
                                  max_turns=args.max_turns)

    t0 = time.monotonic()
    async with SwarmClient(url, client_id=f"pilot-{variant}") as client:
        tokens0 = (await client.status()).throughput["generated_tokens"]
        s = await run_workflow(client, workflow, tasks, group_size=1, concurrency=args.concurrency, eval=True)
        tokens = (await client.status()).throughput["generated_tokens"] - tokens0
    seconds = time.monotonic() - t0
    tool_used = sum(any(line.startswith("tool ->") for line in lg) for lg in logs.values())
    done = max(s.episodes - s.failed, 1)
    return {"variant": variant, "episodes": s.episodes, "failed": s.failed, "success": s.mean_reward,
            "calls": s.calls, "samples": s.samples, "calls_per_episode": s.calls / done,
            "merge_ratio": s.merge_ratio, "tool_used_share": tool_used / max(len(logs), 1),
            "generated_tokens_per_episode": tokens / done, "episodes_per_min": 60 * done / seconds,
            "seconds": seconds, "transcripts": dict(list(logs.items())[:6])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--n", type=int, default=48)
    p.add_argument("--variants", nargs="+", default=["tool_checker"], choices=["tool", "tool_checker", "retry"])
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--split", default="eval", choices=["train", "eval"])
    p.add_argument("--lo", type=int, default=None, help="smallest operand (default: the task's)")
    p.add_argument("--hi", type=int, default=None, help="largest operand (default: the task's)")
    p.add_argument("--ops", default=None, help="operators, e.g. '+-' (default: the task's)")
    p.add_argument("--max-turns", type=int, default=None, help="calls per episode (default: the task's)")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per call (default: the task's)")
    p.add_argument("--system", default="task", choices=sorted(SYSTEMS))
    p.add_argument("--tag", default="", help="a label for this setting (results are merged by tag and variant)")
    args = p.parse_args()

    from agentjet.launch import free_port
    from agentjet.layouts import embedded_engine
    from agentjet.server import SwarmServer
    from agentjet.server.app import BackgroundServer
    from agentjet.settings import GeneratorSettings, ServerConfig
    from agentjet.tasks import calculator

    args.lo = calculator.OPERANDS.start if args.lo is None else args.lo
    args.hi = calculator.OPERANDS.stop - 1 if args.hi is None else args.hi
    args.ops = "".join(calculator.OPS) if args.ops is None else args.ops
    args.max_turns = args.max_turns or calculator.MAX_TURNS
    args.max_tokens = args.max_tokens or calculator.SAMPLING["max_tokens"]
    tasks = make_tasks(args)
    setting = {"split": args.split, "operands": [args.lo, args.hi], "ops": args.ops, "max_turns": args.max_turns,
               "max_tokens": args.max_tokens, "system": tasks[0]["messages"][0]["content"], "n": args.n,
               "concurrency": args.concurrency}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        engine = embedded_engine(args.model, GeneratorSettings(max_batch_size=args.concurrency))
        cfg = ServerConfig(model=args.model, port=free_port(), data_dir=Path(tmp),
                           generator=GeneratorSettings(max_batch_size=args.concurrency))
        with BackgroundServer(SwarmServer(cfg, engine)) as bg:
            for v in args.variants:
                r = asyncio.run(pilot(bg.url, v, tasks, args))
                r.update(tag=args.tag, **setting)
                results.append(r)
                print(f"{args.tag or '-'} {v}: success {r['success']:.3f} over {r['episodes']} episodes, "
                      f"{r['calls_per_episode']:.2f} calls/episode, tool used in {r['tool_used_share']:.0%}, "
                      f"{r['generated_tokens_per_episode']:.0f} tokens/episode, {r['episodes_per_min']:.1f} "
                      f"episodes/min, {r['seconds']:.0f}s", flush=True)
                for tid, lines in list(r["transcripts"].items())[:3]:
                    print(f"  {tid}: " + " | ".join(x[:90] for x in lines))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    old = json.loads(OUT.read_text())["results"] if OUT.exists() else []
    keep = [r for r in old if (r.get("tag", ""), r["variant"]) not in {(x["tag"], x["variant"]) for x in results}]
    OUT.write_text(json.dumps({"machine": platform.machine(), "device": "cpu", "commit": commit, "model": args.model,
                               "results": keep + results}, indent=2))


if __name__ == "__main__":
    main()
