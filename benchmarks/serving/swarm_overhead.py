"""Swarm server overhead.

    python benchmarks/serving/swarm_overhead.py [--quick]

1. Throughput of the full server path (HTTP, auth, validation, chat template, recording) with a null
   engine, at 1, 64 and 256 concurrent episodes. The server runs in its own process (`ajet server
   --engine null`); the load comes from this process over loopback. Target: >= 1,000 calls/s at 64.
2. Added latency per call against calling the engine directly, on SmolLM2-135M-Instruct (greedy,
   fixed length, same tokens both ways, interleaved, medians). Target: <= 5% of generation time.
3. ``--dashboard``: only the 64-episode level, with and without one dashboard client polling the Run page's API
   every 2 s (rounds interleaved, medians). Target: >= 0.95x the calls/s without it. Saves
   benchmarks/results/swarm_overhead_dashboard.json.

Prints a table and saves benchmarks/results/swarm_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from agentjet.runtime.launch import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
MESSAGES = [{"role": "user", "content": "What is 3 + 4? Answer with a number."}]


READ_TOKEN = "bench-read-token-0123456789abcdef"


def start_null_server(port: int, data_dir: str) -> ServerProcess:
    from agentjet.settings import ServerConfig

    config = ServerConfig.model_validate({
        "model": "tiny-random", "port": port, "data_dir": data_dir, "log_level": "WARNING", "lease_seconds": 120,
        "generator": {"kind": "null"}, "training": {"group_size": 4}, "observe": {"read_token": READ_TOKEN}})
    return ServerProcess("null", config, Path(data_dir) / "server.log", Path(data_dir) / "server.yaml").start()


async def poll_dashboard(http, interval: float, stop_at: float) -> int:  # noqa: ANN001
    """What an open Run page does: GET /dashboard/api/run?after=<last step> every ``interval`` seconds (the
    eval curves on the first poll only). Returns the number of polls."""
    headers = {"Authorization": f"Bearer {READ_TOKEN}"}
    polls, after, evals = 0, -1, "true"
    while time.monotonic() < stop_at:
        async with http.get("/dashboard/api/run", params={"after": after, "evals": evals}, headers=headers) as r:
            body = await r.json()
            assert r.status == 200, body
        after = max([after, *[s["step"] for s in body["steps"]]])
        evals = "false"
        polls += 1
        await asyncio.sleep(interval)
    return polls


async def load(url: str, episodes: int, seconds: float, poll_interval: float | None = None) -> dict[str, float]:
    """`episodes` concurrent episodes, each making chat calls back to back for `seconds` (aiohttp client:
    httpx's pool is itself the bottleneck past a few dozen connections); optionally one dashboard poller."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=episodes + 8)
    async with aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as http:
        async def begin(i: int) -> dict:
            async with http.post("/swarm/v1/episodes", json={"client_id": "bench", "task_id": f"t{i % 16}"}) as r:
                return await r.json()

        eps = await asyncio.gather(*[begin(i) for i in range(episodes)])
        latencies: list[float] = []
        errors = 0
        stop_at = time.monotonic() + seconds

        async def worker(ep: dict) -> None:
            nonlocal errors
            headers = {"Authorization": f"Bearer {ep['api_key']}"}
            body = {"model": "agent", "messages": MESSAGES, "max_tokens": 16}
            while time.monotonic() < stop_at:
                t0 = time.perf_counter()
                async with http.post("/v1/chat/completions", json=body, headers=headers) as r:
                    await r.read()
                    errors += r.status != 200
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        poller = [poll_dashboard(http, poll_interval, stop_at)] if poll_interval else []
        done = await asyncio.gather(*[worker(ep) for ep in eps], *poller)
        elapsed = time.perf_counter() - t0
        polls = done[-1] if poll_interval else 0
        for ep in eps:
            async with http.post(f"/swarm/v1/episodes/{ep['episode_id']}/abort", json={"reason": "benchmark"},
                                 headers={"Authorization": f"Bearer {ep['api_key']}"}) as r:
                await r.read()
    latencies.sort()
    return {"episodes": episodes, "calls": len(latencies), "errors": errors, "calls_per_s": len(latencies) / elapsed,
            "dashboard_polls": polls,
            "p50_ms": 1000 * latencies[len(latencies) // 2],
            "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]}


def throughput(levels: list[int], seconds: float) -> list[dict[str, float]]:
    from agentjet.models import resolve_model
    from agentjet.runtime.launch import free_port

    resolve_model("tiny-random")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_null_server(port, tmp)
        proc.wait_ready(120)
        try:
            asyncio.run(load(f"http://127.0.0.1:{port}", 4, 1.0))  # warm up
            return [asyncio.run(load(f"http://127.0.0.1:{port}", n, seconds)) for n in levels]
        finally:
            proc.stop(grace=30)


def dashboard_overhead(rounds: int, seconds: float, interval: float = 2.0) -> dict:
    """64 concurrent episodes with and without one dashboard client polling, alternating rounds on one server."""
    from agentjet.models import resolve_model
    from agentjet.runtime.launch import free_port

    resolve_model("tiny-random")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_null_server(port, tmp)
        proc.wait_ready(120)
        try:
            asyncio.run(load(url, 8, 2.0))  # warm up
            for i in range(2 * rounds):
                polled = i % 2 == 1
                r = asyncio.run(load(url, 64, seconds, interval if polled else None))
                rows.append({**r, "dashboard": polled})
        finally:
            proc.stop(grace=30)
    without = statistics.median(r["calls_per_s"] for r in rows if not r["dashboard"])
    with_ = statistics.median(r["calls_per_s"] for r in rows if r["dashboard"])
    return {"rounds": rows, "poll_interval_s": interval, "seconds_per_round": seconds,
            "calls_per_s_without": without, "calls_per_s_with": with_, "ratio": with_ / without}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def added_latency(rounds: int, max_tokens: int) -> dict[str, float]:
    """Direct engine.generate vs the same generation through the HTTP API, on one server and engine."""
    from agentjet.engines.base import SamplingParams
    from agentjet.layouts import embedded_engine
    from agentjet.runtime.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.http.app import BackgroundServer
    from agentjet.settings import GeneratorSettings, ServerConfig

    engine = embedded_engine("smollm2-135m-instruct", GeneratorSettings(max_batch_size=8))
    engine.generator.rules.stop_ids = frozenset()  # fixed-length generations, so both paths produce the same tokens
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ServerConfig(model="smollm2-135m-instruct", port=free_port(), data_dir=Path(tmp))
        with BackgroundServer(SwarmServer(cfg, engine)) as srv:
            ep = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "b", "task_id": "t"}).json()
            headers = {"Authorization": f"Bearer {ep['api_key']}"}
            body = {"model": "agent", "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0}
            ids = srv.server.formatter.prompt_ids(MESSAGES, None)
            params = SamplingParams(temperature=0, max_tokens=max_tokens)
            direct, api = [], []
            with httpx.Client(timeout=300) as http:
                for i in range(rounds + 1):
                    t0 = time.perf_counter()
                    res = srv.call(engine.generate(ids, params))
                    t1 = time.perf_counter()
                    r = http.post(f"{srv.url}/v1/chat/completions", json=body, headers=headers)
                    t2 = time.perf_counter()
                    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == len(res.token_ids)
                    if i:  # the first round warms up
                        direct.append(t1 - t0)
                        api.append(t2 - t1)
                    if i % 4 == 3:  # keep the episode's record small
                        srv.server.registry.get(ep["episode_id"]).calls.clear()
    d, a = statistics.median(direct), statistics.median(api)
    return {"rounds": rounds, "max_tokens": max_tokens, "direct_ms": 1000 * d, "api_ms": 1000 * a,
            "added_ms": 1000 * (a - d), "added_fraction": (a - d) / d}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="shorter runs")
    p.add_argument("--dashboard", action="store_true", help="only: 64 episodes with vs without a dashboard poller")
    args = p.parse_args()
    seconds = 3.0 if args.quick else 10.0
    console = Console()
    if args.dashboard:
        res = dashboard_overhead(rounds=2 if args.quick else 4, seconds=seconds)
        table = Table(title="64 concurrent episodes, null engine: one dashboard client polling every 2 s")
        for col in ("round", "dashboard", "calls/s", "p50 ms", "errors", "polls"):
            table.add_column(col, justify="right")
        for i, r in enumerate(res["rounds"]):
            table.add_row(str(i), "yes" if r["dashboard"] else "no", f"{r['calls_per_s']:.0f}", f"{r['p50_ms']:.1f}",
                          str(r["errors"]), str(r["dashboard_polls"]))
        console.print(table)
        console.print(f"median calls/s: {res['calls_per_s_without']:.0f} without, {res['calls_per_s_with']:.0f} with "
                      f"the dashboard = {res['ratio']:.3f}x (target >= 0.95)")
        out = {"date": time.strftime("%Y-%m-%d"), "commit": _commit(), "device": "cpu",
               "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}", **res}
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "swarm_overhead_dashboard.json").write_text(json.dumps(out, indent=2))
        console.print(f"saved {RESULTS / 'swarm_overhead_dashboard.json'}")
        return
    console.print("[bold]1. server path throughput (null engine, separate process)[/bold]")
    rows = throughput([1, 64, 256], seconds)
    console.print("[bold]2. added latency vs direct engine calls (SmolLM2)[/bold]")
    lat = added_latency(rounds=4 if args.quick else 10, max_tokens=32)

    table = Table(title="Swarm server overhead")
    for col in ("concurrent episodes", "calls/s", "p50 ms", "p99 ms", "errors"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["episodes"]), f"{r['calls_per_s']:.0f}", f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}",
                      str(r["errors"]))
    console.print(table)
    console.print(f"SmolLM2, {lat['max_tokens']} tokens greedy: direct {lat['direct_ms']:.0f} ms, through the API "
                  f"{lat['api_ms']:.0f} ms, added {lat['added_ms']:.1f} ms = {100 * lat['added_fraction']:.1f}% "
                  "(target <= 5%)")
    at64 = next(r for r in rows if r["episodes"] == 64)["calls_per_s"]
    console.print(f"calls/s at 64 concurrent episodes: {at64:.0f} (target >= 1000)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}",
           "seconds_per_level": seconds, "throughput": rows, "added_latency": lat}
    (RESULTS / "swarm_overhead.json").write_text(json.dumps(out, indent=2))
    console.print(f"saved {RESULTS / 'swarm_overhead.json'}")


if __name__ == "__main__":
    main()
