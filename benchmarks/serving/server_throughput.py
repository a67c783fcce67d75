"""Generation throughput through ``ajet server``, black box, against the same generations on an engine in this
process (engine-direct), in one run.

    .venv/bin/python benchmarks/serving/server_throughput.py                     # CPU: SmolLM2-135M-Instruct, c8 and c16
    .venv/bin/python benchmarks/serving/server_throughput.py --device cuda --model 135m   # c1, c8, c64
    .venv/bin/python benchmarks/serving/server_throughput.py --model tiny-random --concurrency 64 \
        --engine-process off,on       # the CPU proxy: the server with its engine in process, and in an engine process

Server side: ``ajet server`` in its own process (continuous batching, ``--max-batch-size`` = the largest
concurrency); ``c`` clients each begin their own episode and send one chat call (temperature 1, a seed each,
``--max-tokens`` new tokens), all at once (``--calls N``: N calls each, one after the other); tok/s =
completion tokens (from ``usage``) / the wall time from the
first call to the last reply. The episodes are aborted afterwards (nothing is trained). Direct side: an engine
with the same settings in this process, ``engine.generate`` on the prompt ids the server's chat template makes
from the same messages, with the same sampling parameters and seeds, all at once. Both sides generate the same
tokens (checked: the completion-token totals are equal), so the ratio server / direct (``server_over_direct``) is
the server's cost. Rounds alternate server and direct; figures are medians. Target: >= 0.9x at c64 (CPU: c8 and c16).

``--engine-process off,on``: one server per value of ``generator.engine_process`` (off: the engine on a thread of
the server process, as before; on: in an engine process of its own), all started at once and measured in the same
rounds against the same engine-direct, so before and after come from one run (``server_over_direct`` per server
layout: ``in-process``, ``engine-process``). The direct side is the engine on a thread of this process either way.

``--py-spy PREFIX``: after the timed rounds, one more server round at the largest concurrency (not counted) under
two py-spy samplers attached to the server process (``py-spy`` on PATH): ``PREFIX_gil.txt``, the thread holding
the GIL at each sample, and ``PREFIX_all.txt``, every thread, idle ones included (collapsed stacks, one per
thread). The JSON gets each thread's share of the samples and its top frames: where the server process spends
the GIL while the engine thread decodes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # workloads.py

from agentjet.runtime.blocking import run_blocking  # noqa: E402
from agentjet.runtime.omp import prefer_passive_openmp  # noqa: E402

prefer_passive_openmp()

# isort: split
import httpx  # noqa: E402
import torch  # noqa: E402
from workloads import MODEL_ROOT, RESULTS, machine, model_path  # noqa: E402

TOPICS = ["a lighthouse keeper", "how a refrigerator works", "the printing press", "learning the guitar",
          "trees in cities", "photosynthesis", "a medieval blacksmith", "the ocean at night"]


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Write a long, detailed text about {TOPICS[i % len(TOPICS)]} (#{i})."}]


GENERATOR_COUNTERS = ("generate_batches", "decode_steps", "decode_rows", "graph_replays", "graph_captures",
                      "cache_grows", "admit_us", "decode_us")


async def generator_counters(http: httpx.AsyncClient, token: str) -> dict[str, float]:
    """The server's generator counters from ``/metrics`` (``agentjet_generator_*``)."""
    r = await http.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    r.raise_for_status()
    out: dict[str, float] = {}
    for line in r.text.splitlines():
        if line.startswith("agentjet_generator_") and "_total " in line:
            name, value = line.split(" ", 1)
            out[name.removeprefix("agentjet_generator_").removesuffix("_total")] = float(value)
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in GENERATOR_COUNTERS}


LAYOUT_NAMES = {"off": "in-process", "on": "engine-process", "auto": "auto"}


async def through_server(url: str, token: str, c: int, max_tokens: int, round_: int, calls: int = 1) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(900.0),
                                 limits=httpx.Limits(max_connections=c + 8)) as http:
        eps = [(await http.post("/swarm/v1/episodes", json={"client_id": "bench", "task_id": f"t{i}"})).json()
               for i in range(c)]
        before = await generator_counters(http, token)

        async def call(i: int, ep: dict) -> tuple[int, float]:
            n = 0
            for k in range(calls):  # one after the other, in the client's own episode
                body = {"model": "bench", "messages": messages(i), "max_tokens": max_tokens, "temperature": 1.0,
                        "seed": 1000 * round_ + 100_000 * k + i}
                r = await http.post("/v1/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {ep['api_key']}"})
                r.raise_for_status()
                n += int(r.json()["usage"]["completion_tokens"])
            return n, time.perf_counter()

        t0 = time.perf_counter()
        done = await asyncio.gather(*(call(i, ep) for i, ep in enumerate(eps)))
        elapsed = time.perf_counter() - t0
        after = await generator_counters(http, token)
        for ep in eps:
            await http.post(f"/swarm/v1/episodes/{ep['episode_id']}/abort", json={"reason": "benchmark"},
                            headers={"Authorization": f"Bearer {ep['api_key']}"})
    ends = sorted(t - t0 for _, t in done)
    return {"tokens": sum(n for n, _ in done), "seconds": elapsed, "first_reply_s": ends[0],
            "generator": delta(after, before)}


async def direct(engine: Any, formatter: Any, c: int, max_tokens: int, round_: int, calls: int = 1) -> dict[str, Any]:
    from agentjet.engines.base import SamplingParams

    prompts = [formatter.prompt_ids(messages(i), None) for i in range(c)]
    before = {k: float(v) for k, v in engine.generator.counters().items()}

    async def one(i: int, p: list[int]) -> tuple[int, float]:
        n = 0
        for k in range(calls):
            r = await engine.generate(p, SamplingParams(temperature=1.0, max_tokens=max_tokens,
                                                        seed=1000 * round_ + 100_000 * k + i))
            n += len(r.token_ids)
        return n, time.perf_counter()

    t0 = time.perf_counter()
    done = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    elapsed = time.perf_counter() - t0
    ends = sorted(t - t0 for _, t in done)
    return {"tokens": sum(n for n, _ in done), "seconds": elapsed, "first_reply_s": ends[0],
            "generator": delta({k: float(v) for k, v in engine.generator.counters().items()}, before)}


PY_SPY_KINDS = {"gil": ["--gil"], "all": ["--idle"]}


def start_py_spy(pid: int, prefix: Path) -> dict[str, subprocess.Popen]:
    """Two py-spy samplers on ``pid`` (nonblocking: the process is never paused), one per ``PY_SPY_KINDS``."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    return {kind: subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--threads", "--nonblocking",
                                    "--rate", "200", "--format", "raw", "--output", f"{prefix}_{kind}.txt", *extra],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for kind, extra in PY_SPY_KINDS.items()}


def stop_py_spy(procs: dict[str, subprocess.Popen]) -> dict[str, str]:
    """Stop the samplers (SIGINT: py-spy writes its file on it); each one's last words."""
    out = {}
    for kind, proc in procs.items():
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        out[kind] = err.strip().splitlines()[-1] if err.strip() else f"rc={proc.returncode}"
    return out


def thread_shares(collapsed: str, top: int = 12) -> dict[str, Any]:
    """From py-spy's raw output (``thread (TID): NAME;frame;...;leaf COUNT`` a line): the samples, each
    thread's share, and each thread's most frequent innermost frames (the leaf and its caller)."""
    per_thread: dict[str, int] = {}
    leaves: dict[str, dict[str, int]] = {}
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1]
        leaf = " < ".join(reversed(frames[-2:])) if len(frames) > 2 else frames[-1]
        per_thread[thread] = per_thread.get(thread, 0) + n
        leaves.setdefault(thread, {})[leaf] = leaves.get(thread, {}).get(leaf, 0) + n
        total += n
    return {"samples": total,
            "threads": {t: n / total for t, n in sorted(per_thread.items(), key=lambda x: -x[1])} if total else {},
            "top_frames": {t: [[f, n / total] for f, n in sorted(fs.items(), key=lambda x: -x[1])[:top]]
                           for t, fs in leaves.items()}}


def profiled_round(server: Any, token: str, c: int, args: argparse.Namespace, prefix: Path) -> dict[str, Any]:
    """One more server round at ``c`` under py-spy (see the module doc)."""
    procs = start_py_spy(server.pid, prefix)
    time.sleep(2.0)  # the samplers attach
    r = asyncio.run(through_server(server.url, token, c, args.max_tokens, 97, args.calls))
    said = stop_py_spy(procs)
    out: dict[str, Any] = {"concurrency": c, "tok_s": r["tokens"] / r["seconds"], "generator": r["generator"],
                           "py_spy": said}
    for kind in PY_SPY_KINDS:
        f = Path(f"{prefix}_{kind}.txt")
        out[kind] = thread_shares(f.read_text()) if f.exists() else None
    return out


def _per_step_ms(row: dict[str, Any]) -> float:
    g = row["generator"]
    return g["decode_us"] / 1e3 / max(g["decode_steps"], 1)


def _busy(row: dict[str, Any]) -> float:
    g = row["generator"]
    return (g["admit_us"] + g["decode_us"]) / 1e6 / row["seconds"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default=None, help="smollm2-135m-instruct (CPU default), 135m or 1.7b (random "
                   "weights, SmolLM2 shapes; CUDA default 135m)")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=None)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--calls", type=int, default=1, help="calls per client, one after the other (1: one burst of "
                   "c calls; more: a sustained load, where the burst's arrival spread is paid once)")
    p.add_argument("--server-generator", default="{}", type=json.loads,
                   help='JSON: generator settings for the server only, e.g. {"gil_switch_interval_ms": 1}')
    p.add_argument("--engine-process", type=lambda s: s.split(","), default=["off"],
                   help="generator.engine_process of each server, measured side by side in the same rounds (off: the "
                   "engine on a thread of the server process; on: in an engine process; e.g. off,on)")
    p.add_argument("--py-spy", type=Path, default=None, metavar="PREFIX",
                   help="one more server round at the largest concurrency under py-spy (see the module doc)")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    cuda = args.device.startswith("cuda")
    args.model = args.model or ("135m" if cuda else "smollm2-135m-instruct")
    args.concurrency = args.concurrency or ([1, 8, 64] if cuda else [8, 16])
    device = torch.device(args.device)

    from agentjet.layouts import embedded_engine
    from agentjet.runtime.launch import ServerProcess, free_port
    from agentjet.runtime.proc import tail
    from agentjet.server.episodes.chat import ChatFormatter
    from agentjet.settings import GeneratorSettings, PlacementSettings, ServerConfig

    path = model_path(args.model, torch.bfloat16 if cuda else torch.float32, MODEL_ROOT)
    generator, placement = {"max_batch_size": max(args.concurrency)}, {"device": args.device}
    token = "bench-admin-token-0123456789"
    layouts = [LAYOUT_NAMES[v] for v in args.engine_process]
    rows: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        servers = {}
        for value, name in zip(args.engine_process, layouts, strict=True):
            config = ServerConfig.model_validate({
                "model": str(path), "served_model_name": "bench", "port": free_port(), "data_dir": f"{tmp}/{name}",
                "log_level": "WARNING", "lease_seconds": 3600,
                "generator": {**generator, **args.server_generator, "engine_process": value}, "placement": placement,
                "admin_token": token, "training": {"group_size": 1024, "batch_groups": 1024, "min_group_size": 1024}})
            servers[name] = ServerProcess(f"bench-{name}", config, Path(tmp) / f"server-{name}.log",
                                          Path(tmp) / f"server-{name}.yaml").start()
        engine = embedded_engine(path, GeneratorSettings(**generator), placement=PlacementSettings(**placement))
        formatter = ChatFormatter(engine.tokenizer)
        sides = [*layouts, "direct"]

        def one_round(side: str, c: int, round_: int, calls: int) -> dict[str, Any]:
            if side == "direct":
                return asyncio.run(direct(engine, formatter, c, args.max_tokens, round_, calls))
            return asyncio.run(through_server(servers[side].url, token, c, args.max_tokens, round_, calls))

        try:
            for server in servers.values():
                server.wait_ready(600)
            for c in args.concurrency:
                # untimed, every side, at the timed length: a batch of c rows captures its CUDA graphs on first
                # use, and rows that end early (EOS) visit the smaller buckets
                for side in sides:
                    one_round(side, c, 98, 1)
                for rep in range(args.repeats):
                    shift = rep % len(sides)  # each side takes each place in the order in turn
                    for side in sides[shift:] + sides[:shift]:
                        r = one_round(side, c, rep, args.calls)
                        rows.append({"side": "server" if side != "direct" else "direct", "layout": side,
                                     "concurrency": c, "repeat": rep, **r, "tok_s": r["tokens"] / r["seconds"]})
                        g = r["generator"]
                        print(f"  {side:14s} c={c:<3d} "
                              f"{r['tokens']:6d} tokens {r['seconds']:7.2f} s {r['tokens'] / r['seconds']:8.1f} tok/s"
                              f"  prefills {g['generate_batches']:.0f} decode steps {g['decode_steps']:.0f}",
                              file=sys.stderr, flush=True)
            if args.py_spy is not None:
                for name, server in servers.items():
                    prefix = Path(f"{args.py_spy}_{name}") if len(servers) > 1 else args.py_spy
                    try:
                        profiles[name] = profiled_round(server, token, max(args.concurrency), args, prefix)
                    except Exception as exc:  # noqa: BLE001 - a profiler that cannot attach must not lose the rounds
                        profiles[name] = {"error": repr(exc), "gil": None, "tok_s": None, "py_spy": None}
                    profile = profiles[name]
                    print(f"  py-spy round ({name}): {json.dumps({k: profile[k] for k in ('tok_s', 'py_spy')})}\n"
                          f"  GIL held by: {json.dumps((profile['gil'] or {}).get('threads'))}", file=sys.stderr,
                          flush=True)
        except BaseException:
            for name, server in servers.items():  # the servers' logs go with the temporary directory: show them now
                engine_log = Path(tmp) / name / "engine-process.log"
                print(f"--- server {name} (exit code {server.poll()}), the log's tail:\n{tail(server.log_path, 40)}"
                      + (f"\n--- its engine process:\n{tail(engine_log, 40)}" if engine_log.exists() else ""),
                      file=sys.stderr)
            raise
        finally:
            for server in servers.values():
                server.stop(grace=30)
            run_blocking(engine.close())

    summary: dict[str, dict[str, Any]] = {}
    for c in args.concurrency:
        direct_rows = [r for r in rows if r["layout"] == "direct" and r["concurrency"] == c]
        entry: dict[str, Any] = {
            "concurrency": c,
            "direct_tok_s": statistics.median(r["tok_s"] for r in direct_rows),
            "direct_prefills": statistics.median(r["generator"]["generate_batches"] for r in direct_rows),
            "direct_decode_steps": statistics.median(r["generator"]["decode_steps"] for r in direct_rows),
            "direct_ms_per_decode_step": statistics.median(_per_step_ms(r) for r in direct_rows),
            "direct_busy_share": statistics.median(_busy(r) for r in direct_rows),
            "servers": {}}
        for name in layouts:
            srv = [r for r in rows if r["layout"] == name and r["concurrency"] == c]
            ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(srv, direct_rows, strict=True)]
            entry["servers"][name] = {
                "server_tok_s": statistics.median(r["tok_s"] for r in srv),
                "server_over_direct": statistics.median(ratios), "server_over_direct_each": ratios,
                "same_tokens": [a["tokens"] == b["tokens"] for a, b in zip(srv, direct_rows, strict=True)],
                "server_prefills": statistics.median(r["generator"]["generate_batches"] for r in srv),
                "server_decode_steps": statistics.median(r["generator"]["decode_steps"] for r in srv),
                # the engine thread's time per decode step (sampling and the host sync included), and its busy
                # share of the wall time (admission + decode): a slower step, or time spent elsewhere
                "server_ms_per_decode_step": statistics.median(_per_step_ms(r) for r in srv),
                "server_busy_share": statistics.median(_busy(r) for r in srv)}
        entry["server_over_direct"] = {name: s["server_over_direct"] for name, s in entry["servers"].items()}
        summary[str(c)] = entry
    from rich.console import Console
    from rich.table import Table

    m = machine(device)
    table = Table(title=f"Through ajet server vs engine-direct: {args.model} on {m['device_name']} "
                        f"({args.device}), {args.max_tokens} max tokens, {args.calls} call(s) per client, "
                        f"median of {args.repeats}")
    for col in ("clients (one episode each)", "server (engine)", "server tok/s", "direct tok/s",
                "server / direct", "prefills server / direct", "decode steps server / direct",
                "ms per decode step server / direct", "engine thread busy server / direct", "target"):
        table.add_column(col, justify="right")
    for e in summary.values():
        for name, s in e["servers"].items():
            table.add_row(str(e["concurrency"]), name, f"{s['server_tok_s']:.1f}",
                          f"{e['direct_tok_s']:.1f}", f"{s['server_over_direct']:.2f}x",
                          f"{s['server_prefills']:.0f} / {e['direct_prefills']:.0f}",
                          f"{s['server_decode_steps']:.0f} / {e['direct_decode_steps']:.0f}",
                          f"{s['server_ms_per_decode_step']:.2f} / {e['direct_ms_per_decode_step']:.2f}",
                          f"{s['server_busy_share']:.0%} / {e['direct_busy_share']:.0%}",
                          ">= 0.9x" if e["concurrency"] >= 8 else "")
    Console().print(table)
    out = args.output or RESULTS / f"server_throughput_{device.type}_{args.model.replace('.', '')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": m, "args": {k: v for k, v in vars(args).items()}, "rows": rows,
                               "summary": summary, "py_spy_rounds": profiles}, indent=2, default=str) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
