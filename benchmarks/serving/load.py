"""Load test: many concurrent episodes against a null-engine server for minutes; errors, latency, memory.

    python benchmarks/serving/load.py                      # 256 concurrent episodes for 120 s
    python benchmarks/serving/load.py --quick              # 20 s
    python benchmarks/serving/load.py --episodes 64 --seconds 300

The server runs in its own process (`python -m agentjet.cli server --engine null --model tiny-random`,
started by `start_null_server` of benchmarks/serving/swarm_overhead.py). Each of the N concurrent slots loops over
whole episodes: begin, 1-4 chat calls (a heartbeat in one episode of four), end with a random reward, and
begin the next one, so the begin / end / durable-store / trainer paths are exercised as well as chat.
The trainer really runs (null engine: instant steps), so the store's rows are consumed as in a real run.

Reported: errors (target 0), p50 / p99 latency per endpoint, throughput, and the server's RSS memory
(VmRSS from /proc/<pid>/status every second): start, end, max, the slope in MiB/min after a warm-up and
over the second half, and the mean per tenth of the run (target flat). The JSON keys say ``mb``: the values
are MiB. Prints a table and saves benchmarks/results/load.json (``--out`` to change).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # workloads.py
from swarm_overhead import start_null_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
MESSAGES = [{"role": "user", "content": "What is 3 + 4? Answer with a number."}]
ENDPOINTS = ("begin", "chat", "heartbeat", "end")


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class RssSampler(threading.Thread):
    """VmRSS of a process every ``interval`` seconds, as (seconds since start, MiB)."""

    def __init__(self, pid: int, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, float]] = []
        self._halt = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self._halt.is_set():
            mb = rss_mb(self.pid)
            if mb is not None:
                self.samples.append((time.monotonic() - self.t0, mb))
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of RSS over time."""
    if len(samples) < 3:
        return float("nan")
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mm = sum(m for _, m in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    return 60 * sum((t - mt) * (m - mm) for t, m in samples) / var if var else float("nan")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


async def run_load(url: str, episodes: int, seconds: float, seed: int) -> dict:
    """``episodes`` concurrent slots, each running whole episodes back to back until ``seconds`` pass."""
    import aiohttp

    rng = random.Random(seed)
    lat: dict[str, list[float]] = defaultdict(list)
    errors: Counter[str] = Counter()
    error_samples: list[str] = []
    done = Counter()
    attempts: Counter[str] = Counter()
    stop_at = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=episodes + 8)
    timeout = aiohttp.ClientTimeout(total=120)

    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as http:
        async def call(name: str, path: str, body: dict | None, headers: dict | None = None) -> dict | None:
            attempts[name] += 1
            t0 = time.perf_counter()
            try:
                async with http.post(path, json=body, headers=headers) as r:
                    data = await r.read()
                    status = r.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                errors[name] += 1
                if len(error_samples) < 10:
                    error_samples.append(f"{name}: {type(exc).__name__}: {exc}")
                return None
            lat[name].append(time.perf_counter() - t0)
            if status != 200:
                errors[name] += 1
                if len(error_samples) < 10:
                    error_samples.append(f"{name}: HTTP {status}: {data[:200]!r}")
                return None
            return json.loads(data)

        async def slot(i: int) -> None:
            r = random.Random(rng.random())
            await asyncio.sleep(r.random() * 0.5)  # stagger the start
            while time.monotonic() < stop_at:
                ep = await call("begin", "/swarm/v1/episodes",
                                {"client_id": "load", "task_id": f"t{r.randrange(64)}", "metadata": {"slot": i}})
                if ep is None:
                    await asyncio.sleep(0.1)
                    continue
                auth = {"Authorization": f"Bearer {ep['api_key']}"}
                for _ in range(r.randint(1, 4)):  # the episode finishes even if the time is up: none left open
                    await call("chat", "/v1/chat/completions",
                               {"model": "agent", "messages": MESSAGES, "max_tokens": 16}, auth)
                if r.random() < 0.25:
                    await call("heartbeat", f"/swarm/v1/episodes/{ep['episode_id']}/heartbeat", None, auth)
                if await call("end", f"/swarm/v1/episodes/{ep['episode_id']}/end",
                              {"reward": round(r.random(), 3)}, auth) is not None:
                    done["episodes"] += 1

        t0 = time.perf_counter()
        await asyncio.gather(*[slot(i) for i in range(episodes)])
        elapsed = time.perf_counter() - t0

    per_endpoint = {name: {"requests": attempts[name],
                           "errors": errors[name], "per_s": len(lat[name]) / elapsed,
                           "p50_ms": 1000 * pct(lat[name], 0.50), "p99_ms": 1000 * pct(lat[name], 0.99),
                           "max_ms": 1000 * max(lat[name], default=float("nan"))}
                    for name in ENDPOINTS}
    total = sum(len(v) for v in lat.values())
    return {"elapsed_s": elapsed, "episodes_completed": done["episodes"], "episodes_per_s": done["episodes"] / elapsed,
            "requests": total, "requests_per_s": total / elapsed, "chat_calls_per_s": len(lat["chat"]) / elapsed,
            "errors": sum(errors.values()), "error_samples": error_samples, "endpoints": per_endpoint}


def memory_report(samples: list[tuple[float, float]], load_start: float, load_end: float, warmup: float) -> dict:
    before = [m for t, m in samples if t <= load_start]
    during = [(t, m) for t, m in samples if load_start <= t <= load_end]
    steady = [(t, m) for t, m in during if t >= load_start + warmup]
    half = [(t, m) for t, m in during if t >= (load_start + load_end) / 2]
    # mean RSS per tenth of the run (at least a minute): a leak climbs window after window, a warm-up levels off
    width = max(60.0, (load_end - load_start) / 10)
    windows: list[dict[str, float]] = []
    w0 = load_start
    while w0 < load_end - 1e-9:
        ms = [m for t, m in during if w0 <= t < w0 + width]
        if ms:
            windows.append({"from_s": round(w0 - load_start), "to_s": round(min(w0 + width, load_end) - load_start),
                            "mean_mb": round(sum(ms) / len(ms), 1), "max_mb": round(max(ms), 1)})
        w0 += width
    return {"idle_mb": before[-1] if before else None,
            "start_mb": during[0][1] if during else None, "end_mb": during[-1][1] if during else None,
            "max_mb": max((m for _, m in during), default=None),
            "after_warmup_mb": steady[0][1] if steady else None, "warmup_s": warmup,
            "slope_mb_per_min_after_warmup": slope_mb_per_min(steady),
            "slope_mb_per_min_whole_run": slope_mb_per_min(during),
            "slope_mb_per_min_second_half": slope_mb_per_min(half), "windows": windows,
            "samples": [(round(t - load_start, 1), round(m, 1)) for t, m in samples]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=256, help="concurrent episodes (default 256)")
    p.add_argument("--seconds", type=float, default=120.0, help="load duration (default 120)")
    p.add_argument("--quick", action="store_true", help="20 s")
    p.add_argument("--warmup", type=float, default=None, help="seconds excluded from the RSS slope (default: 25%%)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "load.json")
    args = p.parse_args()
    seconds = 20.0 if args.quick else args.seconds
    warmup = args.warmup if args.warmup is not None else 0.25 * seconds

    from agentjet.models import resolve_model
    from agentjet.runtime.launch import free_port

    console = Console()
    resolve_model("tiny-random")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_null_server(port, tmp)
        proc.wait_ready(120)
        sampler = RssSampler(proc.pid)
        sampler.start()
        try:
            asyncio.run(run_load(url, 4, 1.0, args.seed + 1))  # warm the code paths up
            time.sleep(1.5)
            console.print(f"[bold]load:[/bold] {args.episodes} concurrent episodes for {seconds:.0f} s "
                          f"(server pid {proc.pid})")
            load_start = time.monotonic() - sampler.t0
            res = asyncio.run(run_load(url, args.episodes, seconds, args.seed))
            load_end = time.monotonic() - sampler.t0
            time.sleep(1.5)
            status = httpx.get(f"{url}/swarm/v1/status", timeout=30).json()
            alive = proc.poll() is None
        finally:
            sampler.stop()
            proc.stop(grace=60)
    mem = memory_report(sampler.samples, load_start, load_end, warmup)
    buf = status["buffer"]
    server_side = {"open_episodes_after": buf["open_episodes"], "pending_episodes": buf["pending_episodes"],
                   "trained_episodes": buf["trained_episodes"], "dropped_stale": buf["dropped_stale_episodes"],
                   "dropped_uniform": buf["dropped_uniform_episodes"], "train_steps": status["train_steps"],
                   "policy_version": status["policy_version"], "calls": status["throughput"]["calls"],
                   "server_alive_after": alive}
    ended = res["episodes_completed"]
    per_episode_kb = (1024 * (mem["end_mb"] - mem["after_warmup_mb"])
                      / max(1, ended * (load_end - load_start - warmup) / (load_end - load_start))
                      if mem["end_mb"] and mem["after_warmup_mb"] else float("nan"))

    table = Table(title=f"Load: {args.episodes} concurrent episodes, {res['elapsed_s']:.0f} s, null engine")
    for col in ("endpoint", "requests/s", "p50 ms", "p99 ms", "max ms", "errors"):
        table.add_column(col, justify="right")
    for name, e in res["endpoints"].items():
        table.add_row(name, f"{e['per_s']:.0f}", f"{e['p50_ms']:.1f}", f"{e['p99_ms']:.1f}", f"{e['max_ms']:.0f}",
                      str(e["errors"]))
    table.add_row("[bold]all[/bold]", f"{res['requests_per_s']:.0f}", "", "", "", f"[bold]{res['errors']}[/bold]")
    console.print(table)
    console.print(f"episodes completed: {ended} ({res['episodes_per_s']:.1f}/s); chat calls/s "
                  f"{res['chat_calls_per_s']:.0f}; server after: {server_side}")
    mtab = Table(title="Server RSS (VmRSS, sampled every second)")
    for col in ("idle", "load start", "end", "max", f"slope after {warmup:.0f}s warm-up", "slope whole run",
                "growth per ended episode"):
        mtab.add_column(col, justify="right")
    mtab.add_row(f"{mem['idle_mb']:.0f} MiB", f"{mem['start_mb']:.0f} MiB", f"{mem['end_mb']:.0f} MiB",
                 f"{mem['max_mb']:.0f} MiB", f"{mem['slope_mb_per_min_after_warmup']:+.1f} MiB/min",
                 f"{mem['slope_mb_per_min_whole_run']:+.1f} MiB/min", f"{per_episode_kb:.2f} KB")
    console.print(mtab)
    console.print(f"slope over the second half: {mem['slope_mb_per_min_second_half']:+.2f} MiB/min; mean RSS (MiB) per "
                  "window: " + ", ".join(f"{w['from_s']}-{w['to_s']}s {w['mean_mb']:.1f}" for w in mem["windows"]))
    if res["error_samples"]:
        console.print("[red]errors:[/red]", *res["error_samples"], sep="\n  ")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}",
           "command": " ".join(["python", "benchmarks/serving/load.py", *sys.argv[1:]]), "concurrent_episodes": args.episodes,
           "seconds": seconds, "load": res, "server": server_side,
           "memory": {**mem, "growth_per_ended_episode_kb": per_episode_kb}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    console.print(f"saved {args.out}")
    if res["errors"] or not alive:
        sys.exit(1)


if __name__ == "__main__":
    main()
