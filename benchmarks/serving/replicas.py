"""Generator replicas against one generator, through ``ajet server``, in one run: tokens/s of a burst of chat calls
and rollouts per minute of the demo task (training on).

    .venv/bin/python benchmarks/serving/replicas.py          # CPU: SmolLM2-135M-Instruct on every core, c16
    .venv/bin/python benchmarks/serving/replicas.py --device cuda --model 135m --concurrency 64,128   # one GPU

The layouts, named by their replica counts (``--layouts``): ``one``, one generator (``--generator-replicas 1``,
the default layout; on the CPU its torch threads are all the cores: ``--threads``); ``two``, two replicas behind
the router (``--generator-replicas 2``, engine processes, each with half the threads; on a GPU both on the one
GPU). Each round starts a server per layout, in alternating order, and measures:

- ``tok_s`` at each concurrency c: c clients, each its own episode, one chat call each (temperature 1, a seed each,
  ``--max-tokens`` new tokens) all at once, after one untimed burst; completion tokens / wall time (the
  ``through_server`` of ``server_throughput.py``);
- ``rollouts_per_min``: ``--episodes`` demo-task episodes (the harness of tests/fleet: one call each, the
  task's reward with a length term so that the random tiny model trains too; groups of 8, batches of 2 groups,
  training and weight pushes on) at the largest concurrency; acknowledged episodes / wall minutes.

Figures are medians over rounds; ``two_over_one`` is the ratio within each round (the machine is shared: the
spread of the per-round ratios is reported). JSON with commit and machine in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # workloads.py
sys.path.insert(0, str(ROOT / "benchmarks" / "serving"))  # server_throughput.py
sys.path.insert(0, str(ROOT))  # tests/fleet/harness.py

from agentjet.runtime.omp import prefer_passive_openmp  # noqa: E402

prefer_passive_openmp()

# isort: split
import torch  # noqa: E402
from server_throughput import through_server  # noqa: E402
from tests.fleet.harness import demo_load, start_server, status  # noqa: E402
from workloads import MODEL_ROOT, RESULTS, machine, model_path  # noqa: E402

from agentjet.runtime.provenance import git_commit  # noqa: E402
from agentjet.settings import ServerConfig  # noqa: E402

LAYOUTS = {"one": 1, "two": 2}
TOKEN = "bench-admin-token-0123456789"
GROUP = 8  # episodes per task: the server's group size


def server_config(path: Path, data_dir: Path, replicas: int, threads: int, args: argparse.Namespace) -> ServerConfig:
    fleet = {"threads": max(threads // replicas, 1), "startup_timeout_s": 900} if replicas > 1 else {}
    return ServerConfig.model_validate({
        "model": str(path), "served_model_name": "bench", "data_dir": str(data_dir), "log_level": "WARNING",
        "lease_seconds": 3600, "admin_token": TOKEN, "placement": {"device": args.device},
        "learner": {"learning_rate": 1e-5},
        # admission off: the bursts begin c episodes of c tasks at once, beyond the staleness bound's capacity
        "training": {"group_size": GROUP, "batch_groups": 2, "checkpoint_every": 0, "admission": False},
        "generator": {"max_batch_size": max(args.concurrency), "replicas": replicas, "fleet": fleet}})


def measure(path: Path, name: str, threads: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    replicas = LAYOUTS[name]
    work = Path(tempfile.mkdtemp(dir=tmp, prefix=f"{name}-"))
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}  # the server's own torch
    t0 = time.monotonic()
    server = start_server(server_config(path, work / "data", replicas, threads, args), work, timeout=900, env=env)
    out: dict[str, Any] = {"layout": name, "replicas": replicas, "start_s": time.monotonic() - t0, "tok_s": {}}
    try:
        for c in args.concurrency:
            asyncio.run(through_server(server.url, TOKEN, c, args.max_tokens, 98))  # untimed
            r = asyncio.run(through_server(server.url, TOKEN, c, args.max_tokens, 0))
            out["tok_s"][str(c)] = r["tokens"] / r["seconds"]
            print(f"  {name}: c={c} {r['tokens']} tokens in {r['seconds']:.1f} s: {out['tok_s'][str(c)]:.1f} tok/s",
                  flush=True)
        if args.episodes:
            t1 = time.monotonic()
            load = asyncio.run(demo_load(server.url, args.episodes, max(args.concurrency), group_size=GROUP))
            minutes = (time.monotonic() - t1) / 60
            steps = status(server.url).train_steps
            out.update(rollouts=load.acknowledged, rollouts_per_min=load.acknowledged / minutes,
                       server_errors=load.server_errors, failed=len(load.failed), train_steps=steps)
            print(f"  {name}: {load.acknowledged} rollouts in {minutes:.2f} min: {out['rollouts_per_min']:.1f}/min",
                  flush=True)
    finally:
        server.stop(grace=60)
    return out


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    by = {name: [r for r in rows if r["layout"] == name] for name in args.layouts}
    out: dict[str, Any] = {}
    for name, rs in by.items():
        out[name] = {"replicas": LAYOUTS[name],
                     "tok_s": {str(c): statistics.median(r["tok_s"][str(c)] for r in rs) for c in args.concurrency}}
        if args.episodes:
            out[name]["rollouts_per_min"] = statistics.median(r["rollouts_per_min"] for r in rs)
    if {"one", "two"} <= set(by) and len(by["one"]) == len(by["two"]):
        pairs = list(zip(by["one"], by["two"], strict=True))
        out["two_over_one"] = {f"tok_s_c{c}": spread([b["tok_s"][str(c)] / a["tok_s"][str(c)] for a, b in pairs])
                               for c in args.concurrency}
        if args.episodes:
            out["two_over_one"]["rollouts_per_min"] = spread([b["rollouts_per_min"] / a["rollouts_per_min"]
                                                              for a, b in pairs])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", default=None, help="smollm2-135m-instruct (CPU default), 135m or 1.7b (random "
                   "weights, SmolLM2 shapes; CUDA default 135m), tiny-random")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=None)
    p.add_argument("--layouts", type=lambda s: s.split(","), default=list(LAYOUTS))
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="CPU threads in all: the one "
                   "generator's, split evenly among replicas")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--episodes", type=int, default=96, help="demo episodes per layout and round (0: tokens only)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    cuda = args.device.startswith("cuda")
    args.model = args.model or ("135m" if cuda else "smollm2-135m-instruct")
    args.concurrency = args.concurrency or ([64, 128] if cuda else [16])
    path = model_path(args.model, torch.bfloat16 if cuda else torch.float32, MODEL_ROOT)
    rows: list[dict[str, Any]] = []
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            order = args.layouts if rnd % 2 == 0 else list(reversed(args.layouts))
            for name in order:
                print(f"round {rnd}: {name} ({LAYOUTS[name]} replica(s), {args.threads} threads in all)", flush=True)
                rows.append({"round": rnd, **measure(path, name, args.threads, args, Path(tmp))})
    result = {"benchmark": "replicas", "command": " ".join(["benchmarks/serving/replicas.py", *sys.argv[1:]]),
              "commit": git_commit(ROOT), "machine": machine(torch.device(args.device)), "model": args.model,
              "device": args.device, "threads": args.threads, "max_tokens": args.max_tokens,
              "episodes": args.episodes, "concurrency": args.concurrency, "seconds": time.time() - started,
              "layouts": {name: {"replicas": LAYOUTS[name],
                                 "threads_per_replica": max(args.threads // LAYOUTS[name], 1)}
                          for name in args.layouts},
              "summary": summarize(rows, args), "rounds": rows}
    out = args.output or RESULTS / f"replicas_{'cuda' if cuda else 'cpu'}_{args.model.replace('/', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
