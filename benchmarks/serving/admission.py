"""Admission within the staleness bound: how many rollouts a fast swarm wastes as too stale, with admission off,
on with 429 refusals, and on with held begins (a long poll), measured in one run.

A null-engine server (a generation takes ``--gen-ms``; training is instant, so the policy version moves as
fast as batches fill) and ``--clients`` concurrent client loops. Each loop plays whole episodes: begin, one chat
call, end with a random 0/1 reward. Groups of ``--group-size`` form by task id. With ``max_staleness=1`` and
admission off, most episodes finish several versions after they began and are dropped. With admission on, the
server only admits what can still be trained: in ``429`` mode the clients ask not to wait (``wait_s: 0``) and
wait out each 429 ``at_capacity`` as the SDK does; in ``wait`` mode the server holds a begin until its group fits
(the default), and a client asks again at once if a hold runs out.

    .venv/bin/python benchmarks/serving/admission.py                 # 256 clients, 60 s per mode
    .venv/bin/python benchmarks/serving/admission.py --quick         # 64 clients, 15 s per mode
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import os
import platform
import random
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from agentjet.runtime.launch import ServerProcess, free_port
from agentjet.settings import ServerConfig

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "admission.json"
MESSAGES = [{"role": "user", "content": "What is 3 + 4?"}]


MODES = ("off", "429", "wait")  # admission off; on, refusing with 429; on, holding the begin (a long poll)


async def swarm(url: str, clients: int, seconds: float, group_size: int, seed: int, mode: str) -> dict[str, float]:
    import aiohttp

    rng = random.Random(seed)
    tasks = itertools.count()
    pending_task: list[str] = []  # a group's task id stays open until group_size members began
    counts = {"episodes": 0, "refused": 0, "errors": 0}
    stop_at = time.monotonic() + seconds

    def next_task() -> str:
        if not pending_task:
            task = f"t{next(tasks)}"
            pending_task.extend([task] * group_size)
        return pending_task.pop()

    connector = aiohttp.TCPConnector(limit=clients + 8)
    async with aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as http:
        async def loop(i: int) -> None:
            task = next_task()
            while time.monotonic() < stop_at:
                begin: dict[str, Any] = {"client_id": f"c{i}", "task_id": task}
                if mode == "429":
                    begin["wait_s"] = 0
                elif mode == "wait":
                    begin["wait_s"] = max(0.05, stop_at - time.monotonic())  # never held past the run
                async with http.post("/swarm/v1/episodes", json=begin) as r:
                    body = await r.json()
                    if r.status == 429:
                        counts["refused"] += 1
                        await asyncio.sleep(int(r.headers.get("Retry-After-Ms", "250")) / 1000)
                        continue
                    if r.status != 200:
                        counts["errors"] += 1
                        await asyncio.sleep(0.1)
                        continue
                key = {"Authorization": f"Bearer {body['api_key']}"}
                async with http.post("/v1/chat/completions", json={"model": "a", "messages": MESSAGES},
                                     headers=key) as r:
                    await r.read()
                    counts["errors"] += r.status != 200
                async with http.post(f"/swarm/v1/episodes/{body['episode_id']}/end",
                                     json={"reward": float(rng.random() < 0.5)}, headers=key) as r:
                    await r.read()
                    counts["errors"] += r.status != 200
                counts["episodes"] += 1
                task = next_task()

        t0 = time.perf_counter()
        await asyncio.gather(*[loop(i) for i in range(clients)])
        counts["seconds"] = time.perf_counter() - t0
    return counts


def server_config(mode: str, args: argparse.Namespace, port: int, data_dir: str) -> ServerConfig:
    return ServerConfig.model_validate({
        "model": "tiny-random", "port": port, "data_dir": data_dir, "log_level": "WARNING", "lease_seconds": 300,
        "generator": {"kind": "null", "null_delay_ms": args.gen_ms},
        "training": {"group_size": args.group_size, "batch_groups": args.batch_groups, "max_staleness": 1,
                     "admission": mode != "off", "group_timeout_s": 5, "checkpoint_every": 0}})


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = server_config(mode, args, port, tmp)
        server = ServerProcess("admission", config, Path(tmp) / "server.log", Path(tmp) / "server.yaml").start()
        try:
            server.wait_ready(120)
            client = asyncio.run(swarm(server.url, args.clients, args.seconds, args.group_size, args.seed, mode))
            time.sleep(2.0)  # the last groups train or time out
            status = httpx.get(f"{server.url}/swarm/v1/status", timeout=30).json()
        finally:
            server.stop(grace=30)
    buf = status["buffer"]
    used, stale = buf["trained_episodes"], buf["dropped_stale_episodes"]
    return {"mode": mode, "admission": mode != "off", **client, "trained": used, "dropped_stale": stale,
            "dropped_uniform": buf["dropped_uniform_episodes"], "pending": buf["pending_episodes"],
            "train_steps": status["train_steps"], "stale_share": stale / max(1, used + stale),
            "held": status["throughput"].get("admission_held", 0),
            "episodes_per_s": client["episodes"] / client["seconds"], "trained_per_s": used / client["seconds"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=256)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--gen-ms", type=float, default=50.0, help="null engine time per generation")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--batch-groups", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    if args.quick:
        args.clients, args.seconds = 64, 15.0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        p.error(f"--modes: choose from {', '.join(MODES)}")
    rows = [run_mode(mode, args) for mode in modes]
    table = Table(title=f"admission: {args.clients} clients, max_staleness=1, batch "
                        f"{args.batch_groups}x{args.group_size}, {args.seconds:.0f} s per mode")
    for col in ("admission", "episodes/s", "trained/s", "dropped stale", "stale share", "429 refusals", "held",
                "errors"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["mode"], f"{r['episodes_per_s']:.1f}", f"{r['trained_per_s']:.1f}", str(r["dropped_stale"]),
                      f"{r['stale_share']:.1%}", str(r["refused"]), str(r["held"]), str(r["errors"]))
    Console().print(table)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "src", "benchmarks/*.py"],
                                capture_output=True, text=True, cwd=ROOT).stdout.strip())  # the code measured (not results)
    by_mode = {r["mode"]: r for r in rows}
    result = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "commit": commit.strip(),
              "dirty": dirty, "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "device": "cpu",
              "settings": {k: v for k, v in vars(args).items() if k != "out"},
              "loss": server_config(modes[0], args, 0, "/tmp").loss.model_dump(mode="json"), "modes": rows}
    for a, b in (("429", "off"), ("wait", "off"), ("wait", "429")):
        if a in by_mode and b in by_mode:
            result[f"stale_share_ratio_{a}_vs_{b}"] = by_mode[a]["stale_share"] / max(by_mode[b]["stale_share"], 1e-9)
            result[f"trained_per_s_ratio_{a}_vs_{b}"] = (by_mode[a]["trained_per_s"]
                                                         / max(by_mode[b]["trained_per_s"], 1e-9))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
