"""A two-role team (planner and executor, ``examples/team_two_models.py``) trained two ways, same task, same
budget, same model and LoRA rank:

- **one server**: one base model, one LoRA adapter per role (``--lora-rank R --adapters planner,executor``);
- **two servers**: one server per role, each with its own copy of the model and one LoRA adapter.

For each layout and seed: the servers' memory (RSS now and its peak, summed over the servers' processes, taken
after both roles have stepped, so every optimizer state exists) and each role's held-out reward (greedy, on
tasks never trained on) before and after ``--budget-min`` minutes of training. Writes a table and
``benchmarks/results/team_adapters.json`` (machine, device, commit).

    .venv/bin/python benchmarks/learning/team_adapters.py                          # 2 seeds, 4 min each
    .venv/bin/python benchmarks/learning/team_adapters.py --seeds 0 --budget-min 1  # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from agentjet import Team
from agentjet.models import DEFAULT_MODEL
from agentjet.runtime.launch import ServerProcess, free_port
from agentjet.runtime.provenance import device, git_commit, machine
from agentjet.settings import LearnerSettings, LoraSettings, ServerConfig, TrainingSettings

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "team_adapters.json"
ROLES = ("planner", "executor")
LAYOUTS = ("one-server", "two-servers")
console = Console()


def example() -> Any:
    """The team example's task, reward and workflow (one copy of them: the example's)."""
    spec = importlib.util.spec_from_file_location("team_example", ROOT / "examples" / "team_two_models.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def held_out(n: int) -> list[dict[str, Any]]:
    """``n`` fixed tasks (the same for every layout and seed), none of which is ever trained on."""
    pairs = random.Random(999).sample([(a, b) for a in range(10) for b in range(10)], n)
    return [{"task_id": f"held-{a}-{b}", "a": a, "b": b, "answer": str(a + b)} for a, b in pairs]


def configs(layout: str, args: argparse.Namespace, seed: int, root: Path) -> list[ServerConfig]:
    training = TrainingSettings(group_size=args.group_size, batch_groups=1, checkpoint_every=0)

    def one(name: str, adapters: list[str]) -> ServerConfig:
        return ServerConfig(model=args.model, port=free_port(), data_dir=root / name, training=training,
                            learner=LearnerSettings(learning_rate=args.lr,
                                                    lora=LoraSettings(rank=args.rank, adapters=adapters)),
                            generator={"seed": seed, "max_batch_size": 2 * args.concurrency * args.group_size})

    if layout == "one-server":
        return [one("team", list(ROLES))]
    return [one(role, []) for role in ROLES]


async def evaluate(mod: Any, roles: dict[str, str], tasks: list[dict[str, Any]]) -> dict[str, float]:
    async with Team(roles, client_id="team-eval") as team:
        results = await asyncio.gather(*[mod.team_episode(team, t, temperature=0.0, eval=True) for t in tasks])
    return {role: statistics.fmean(r[role] for r in results) for role in ROLES}


async def train(mod: Any, roles: dict[str, str], args: argparse.Namespace, seed: int,
                held: set[tuple[int, int]]) -> int:
    """Team episodes in groups of ``group_size`` (``concurrency`` groups at once) for the budget; the episodes
    run."""
    rng = random.Random(seed)
    deadline = time.monotonic() + args.budget_min * 60
    counter = iter(range(10**9))
    done = 0

    def next_task() -> dict[str, Any]:
        while True:
            task = mod.make_task(rng, next(counter))
            if (task["a"], task["b"]) not in held:
                return task

    async with Team(roles, client_id=f"team-train-{seed}") as team:
        async def loop() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                task = next_task()
                await asyncio.gather(*[mod.team_episode(team, task) for _ in range(args.group_size)])
                done += args.group_size

        await asyncio.gather(*[loop() for _ in range(args.concurrency)])
    return done


def memory(servers: list[ServerProcess]) -> dict[str, float]:
    """RSS now and its peak (VmHWM), summed over the servers and their children, in MiB."""
    now = peak = 0.0
    for s in servers:
        procs = [psutil.Process(s.pid), *psutil.Process(s.pid).children(recursive=True)]
        for p in procs:
            now += p.memory_info().rss
            status = Path(f"/proc/{p.pid}/status").read_text()
            peak += next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM"))
    return {"rss_mib": now / 2**20, "peak_rss_mib": peak / 2**20}


def steps_of(servers: list[ServerProcess]) -> dict[str, int]:
    import httpx

    out: dict[str, int] = {}
    for s, role_names in zip(servers, [list(ROLES)] if len(servers) == 1 else [[r] for r in ROLES], strict=True):
        status = httpx.get(f"{s.url}/swarm/v1/status", timeout=30).json()
        for role in role_names:
            out[role] = status["adapters"][role]["train_steps"] if status["adapters"] else status["train_steps"]
    return out


def run_one(mod: Any, layout: str, seed: int, args: argparse.Namespace, tasks: list[dict[str, Any]]) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"team-{layout}-") as tmp:
        servers = [ServerProcess(c.data_dir.name if c.data_dir else "s", c, Path(tmp) / f"{i}.log",
                                 Path(tmp) / f"{i}.yaml") for i, c in enumerate(configs(layout, args, seed, Path(tmp)))]
        for s in servers:
            s.start()
        try:
            for s in servers:
                s.wait_ready()
            urls = [s.url for s in servers]
            roles = {role: urls[0] if len(urls) == 1 else urls[i] for i, role in enumerate(ROLES)}
            t0 = time.monotonic()
            before = asyncio.run(evaluate(mod, roles, tasks))
            t1 = time.monotonic()
            episodes = asyncio.run(train(mod, roles, args, seed, {(t["a"], t["b"]) for t in tasks}))
            t2 = time.monotonic()
            steps = steps_of(servers)
            mem = memory(servers)
            after = asyncio.run(evaluate(mod, roles, tasks))
            row = {"layout": layout, "seed": seed, "before": before, "after": after, "steps": steps,
                   "episodes": episodes, "train_min": (t2 - t1) / 60, "eval_min": (t1 - t0) / 60, **mem}
            console.print(row)
            return row
        finally:
            for s in servers:
                s.stop(grace=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--budget-min", type=float, default=4.0, help="training minutes per layout and seed")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=2, help="task groups in flight")
    p.add_argument("--eval-tasks", type=int, default=24)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    mod = example()
    tasks = held_out(args.eval_tasks)
    rows = [run_one(mod, layout, seed, args, tasks) for seed in args.seeds for layout in LAYOUTS]
    table = Table(title=f"team on one server vs two servers ({args.model}, LoRA rank {args.rank}, "
                        f"{args.budget_min:g} min, {args.eval_tasks} held-out tasks)")
    for col in ("layout", "seed", "planner before→after", "executor before→after", "steps (p/e)", "episodes",
                "RSS MiB", "peak RSS MiB"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["layout"], str(r["seed"]), f"{r['before']['planner']:.3f}→{r['after']['planner']:.3f}",
                      f"{r['before']['executor']:.3f}→{r['after']['executor']:.3f}",
                      f"{r['steps']['planner']}/{r['steps']['executor']}", str(r["episodes"]),
                      f"{r['rss_mib']:.0f}", f"{r['peak_rss_mib']:.0f}")
    console.print(table)

    def mean(layout: str, key: str) -> float:
        return statistics.fmean(r[key] for r in rows if r["layout"] == layout)

    ratios = {"rss": mean("one-server", "rss_mib") / mean("two-servers", "rss_mib"),
              "peak_rss": mean("one-server", "peak_rss_mib") / mean("two-servers", "peak_rss_mib")}
    console.print(f"memory, one server / two servers: RSS {ratios['rss']:.2f}x, peak {ratios['peak_rss']:.2f}x "
                  "(target <= 0.6x)")
    out = {"benchmark": "team_adapters", "commit": git_commit(), "machine": machine(), "device": device(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "settings": vars(args) | {"out": str(args.out)},
           "rows": rows, "memory_ratio": ratios}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
