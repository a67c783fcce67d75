"""Where a demo training minute goes: generation, train steps, and everything else.

Runs the demo's training loop (the built-in task's workflow through a real swarm server, SmolLM2 on the
HF engine) for ``--seconds`` and times the engine's two kinds of work on its worker thread: generation
batches (with their sizes) and train steps. The server runs in this process (a background thread) so the
engine can be timed; the demo itself runs it as a subprocess.

    .venv/bin/python benchmarks/training/demo_profile.py --seconds 180 --concurrency 8 --max-batch 8
    .venv/bin/python benchmarks/training/demo_profile.py --seconds 180 --concurrency 32 --max-batch 32

Prints a table and writes benchmarks/results/demo_profile.json (one entry per run, appended by label).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import agentjet  # noqa: F401  (sets the OpenMP wait policy before torch loads)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks" / "results" / "demo_profile.json"


class EngineTimer:
    """Wraps the embedded layout's batch generation and train step with wall-clock timers (worker thread)."""

    def __init__(self, engine: Any) -> None:
        self.gen_s = 0.0
        self.train_s = 0.0
        self.batches: list[int] = []
        self.steps = 0
        gen, train = engine.generator._run_batch_sync, engine.learner._train  # the worker thread's two jobs

        def timed_gen(reqs: list[Any]) -> Any:
            t = time.perf_counter()
            try:
                return gen(reqs)
            finally:
                self.gen_s += time.perf_counter() - t
                self.batches.append(len(reqs))

        def timed_train(batch: list[Any]) -> Any:
            t = time.perf_counter()
            try:
                return train(batch)
            finally:
                self.train_s += time.perf_counter() - t
                self.steps += 1

        engine.generator._run_batch_sync = timed_gen
        engine.learner._train = timed_train


async def _drive(url: str, task: str, seconds: float, group_size: int, concurrency: int) -> dict[str, Any]:
    from agentjet.client.client import SwarmClient
    from agentjet.client.runner import run_workflow, task_workflow
    from agentjet.tasks import get_task

    task_mod = get_task(task)
    stop = asyncio.Event()

    def tasks() -> Any:
        round_ = 0
        while not stop.is_set():
            for t in task_mod.generate_tasks("train", 64, seed=round_):
                if stop.is_set():
                    return
                yield {**t, "task_id": f"{t['task_id']}-r{round_}"}
            round_ += 1

    async def timer() -> None:
        await asyncio.sleep(seconds)
        stop.set()

    async with SwarmClient(url, client_id="profile") as client:
        t = asyncio.create_task(timer())
        summary = await run_workflow(client, task_workflow(task_mod, task_mod.SAMPLING, model="demo"), tasks(),
                                     group_size=group_size, concurrency=concurrency)
        await t
        status = await client.status()
    return {"episodes": summary.episodes, "failed": summary.failed, "reward_mean": summary.mean_reward,
            "status": status.model_dump()}


def profile(args: argparse.Namespace) -> dict[str, Any]:
    from agentjet.layouts import embedded_engine
    from agentjet.runtime.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.http.app import BackgroundServer
    from agentjet.settings import GeneratorSettings, LearnerSettings, ServerConfig, TrainingSettings
    from agentjet.tasks import get_task

    rec = get_task(args.task).RECOMMENDED
    learner = LearnerSettings(**rec.learner())
    engine = embedded_engine(args.model, GeneratorSettings(max_batch_size=args.max_batch), learner)
    timer = EngineTimer(engine)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ServerConfig(model=args.model, port=free_port(), data_dir=Path(tmp),
                           generator=GeneratorSettings(max_batch_size=args.max_batch), learner=learner,
                           training=TrainingSettings(**rec.training(), checkpoint_every=0,
                                                     max_staleness=args.max_staleness))
        bg = BackgroundServer(SwarmServer(cfg, engine)).start()
        try:
            t0 = time.perf_counter()
            run = asyncio.run(_drive(bg.url, args.task, args.seconds, rec.group_size, args.concurrency))
            wall = time.perf_counter() - t0
        finally:
            bg.stop()
    st = run["status"]
    buf = st["buffer"]
    n = sum(timer.batches)
    return {
        "label": args.label or f"c{args.concurrency}-b{args.max_batch}",
        "concurrency": args.concurrency, "max_batch": args.max_batch, "wall_s": wall,
        "generate_s": timer.gen_s, "train_s": timer.train_s, "other_s": wall - timer.gen_s - timer.train_s,
        "generate_batches": len(timer.batches), "mean_batch": n / max(len(timer.batches), 1),
        "generated_tokens": st["throughput"]["generated_tokens"], "train_steps": timer.steps,
        "episodes": run["episodes"], "trained_episodes": buf["trained_episodes"],
        "dropped_uniform": buf["dropped_uniform_episodes"], "dropped_stale": buf["dropped_stale_episodes"],
        "pending_at_end": buf["pending_episodes"], "train_reward_mean": run["reward_mean"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--task", default="addition")
    p.add_argument("--seconds", type=float, default=180)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-staleness", type=int, default=2)
    p.add_argument("--label", default=None)
    args = p.parse_args()
    r = profile(args)
    w = r["wall_s"]
    print(f"{r['label']}: {w:.0f} s wall, {r['train_steps']} train steps, {r['episodes']} episodes "
          f"({r['dropped_uniform']} in uniform groups, {r['dropped_stale']} stale)")
    print(f"  generation {r['generate_s']:.0f} s ({r['generate_s'] / w:.0%}) in {r['generate_batches']} batches "
          f"(mean {r['mean_batch']:.1f} requests), {r['generated_tokens']} tokens")
    print(f"  train      {r['train_s']:.0f} s ({r['train_s'] / w:.0%})")
    print(f"  other      {r['other_s']:.0f} s ({r['other_s'] / w:.0%}): HTTP, chat template, tracking, store, idle")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    runs = json.loads(OUT.read_text())["runs"] if OUT.exists() else []
    runs = [x for x in runs if x["label"] != r["label"]] + [r]
    OUT.write_text(json.dumps({"machine": platform.machine(), "cpus": __import__("os").cpu_count(), "device": "cpu",
                               "python": sys.version.split()[0], "commit": commit, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
