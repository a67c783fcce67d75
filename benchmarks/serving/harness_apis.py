"""The harness APIs' cost: the same generations through ``/v1/responses`` and ``/v1/messages`` against
``/v1/chat/completions``, on one ``ajet server``, at ``c`` concurrent clients.

    .venv/bin/python benchmarks/serving/harness_apis.py                      # CPU: SmolLM2-135M-Instruct, c8
    .venv/bin/python benchmarks/serving/harness_apis.py --model tiny-random --max-tokens 32 --repeats 2   # short
    .venv/bin/python benchmarks/serving/harness_apis.py --engine null --calls 40    # the routes' own cost alone
    .venv/bin/python benchmarks/serving/harness_apis.py --asgi                       # CPU per call, in process

Each client begins its own episode and sends one call (the same messages, temperature 1, a seed each: the seed is
an AgentJet extension on Responses and Messages, so all three APIs generate the same tokens, checked), all at
once; tok/s = completion tokens (from each API's usage) / the wall time from the first call to the last reply.
Rounds rotate the order of the APIs; ``--stream`` measures the streamed routes instead (each API's own events).
Figures are medians; the ratio is each API's tok/s over chat's in the same round. Target: >= 0.95x at c8.
Beside the wall time, the server process's CPU time per call (user + system, all its threads) is recorded: on a
shared, loaded machine the wall-time ratio swings with the neighbours, the CPU per call much less.
``--asgi``: no server process and no model: the app in this process with the null engine, called through httpx's
ASGI transport one call at a time, and the CPU time of the event loop's thread per call (the routes' whole work:
validation, translation, the chat template, recording, rendering; the client's share is the same for each API),
rounds rotating the APIs: the figure that a loaded machine moves least.
``--engine null`` replaces the model by the null engine (a canned reply of ``--max-tokens`` tokens at once): what
is left is the server's own work per call (HTTP, translation, the chat template, recording, rendering), the
worst case for the ratio; ``--calls N`` sends N calls per client, one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # workloads.py

from agentjet.runtime.omp import prefer_passive_openmp  # noqa: E402

prefer_passive_openmp()

# isort: split
import httpx  # noqa: E402
import torch  # noqa: E402
from workloads import MODEL_ROOT, RESULTS, ROOT, machine, model_path  # noqa: E402

from agentjet.runtime import provenance  # noqa: E402

APIS = ("chat", "responses", "messages")
TOPICS = ["a lighthouse keeper", "how a refrigerator works", "the printing press", "learning the guitar",
          "trees in cities", "photosynthesis", "a medieval blacksmith", "the ocean at night"]


def request(api: str, i: int, max_tokens: int, seed: int, stream: bool) -> tuple[str, dict[str, Any]]:
    """The route and body of one call of ``api``: the same conversation and sampling in each API's words."""
    system, user = "You write long, detailed texts.", f"Write about {TOPICS[i % len(TOPICS)]} (#{i})."
    common = {"model": "bench", "temperature": 1.0, "seed": seed, "stream": stream}
    if api == "chat":
        return "/v1/chat/completions", {**common, "max_tokens": max_tokens, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": user}],
            **({"stream_options": {"include_usage": True}} if stream else {})}
    if api == "responses":
        return "/v1/responses", {**common, "max_output_tokens": max_tokens, "instructions": system, "input": user}
    return "/v1/messages", {**common, "max_tokens": max_tokens, "system": system,
                            "messages": [{"role": "user", "content": user}]}


def completion_tokens(api: str, r: httpx.Response, stream: bool) -> int:
    """The generated tokens, from the API's own usage (the last usage a stream carries)."""
    if not stream:
        usage = r.json()["usage"]
        return int(usage["completion_tokens"] if api == "chat" else usage["output_tokens"])
    found = 0
    for line in r.text.splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        usage = event.get("usage") or (event.get("response") or {}).get("usage")
        if usage:
            found = int(usage.get("completion_tokens", usage.get("output_tokens", 0)))
    return found


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far (user + system, every thread)."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


async def one_round(url: str, api: str, c: int, max_tokens: int, round_: int, stream: bool,
                    calls: int = 1, pid: int | None = None) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(900.0),
                                 limits=httpx.Limits(max_connections=c + 8)) as http:
        eps = [(await http.post("/swarm/v1/episodes", json={"client_id": "bench", "task_id": f"t{i}"})).json()
               for i in range(c)]

        async def call(i: int, ep: dict[str, Any]) -> int:
            n = 0
            for k in range(calls):
                path, body = request(api, i, max_tokens, 1000 * round_ + 100_000 * k + i, stream)
                r = await http.post(path, json=body, headers={"Authorization": f"Bearer {ep['api_key']}"})
                r.raise_for_status()
                n += completion_tokens(api, r, stream)
            return n

        cpu0, t0 = cpu_seconds(pid) if pid else 0.0, time.perf_counter()
        tokens = await asyncio.gather(*(call(i, ep) for i, ep in enumerate(eps)))
        elapsed = time.perf_counter() - t0
        cpu = cpu_seconds(pid) - cpu0 if pid else float("nan")
        for ep in eps:
            await http.post(f"/swarm/v1/episodes/{ep['episode_id']}/abort", json={"reason": "benchmark"},
                            headers={"Authorization": f"Bearer {ep['api_key']}"})
    return {"api": api, "round": round_, "tokens": sum(tokens), "per_call": list(tokens), "seconds": elapsed,
            "tok_s": sum(tokens) / elapsed, "calls_s": c * calls / elapsed, "server_cpu_s": cpu,
            "server_cpu_ms_per_call": 1000 * cpu / (c * calls)}


def asgi_cpu(calls: int, repeats: int, max_tokens: int, stream: bool) -> dict[str, list[float]]:
    """``--asgi``: microseconds of the event loop thread's CPU per call, per API and round."""
    from transformers import AutoTokenizer

    from agentjet.layouts.null import null_engine
    from agentjet.models import resolve_model
    from agentjet.runtime.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.http.app import BackgroundServer
    from agentjet.settings import ServerConfig, TrainingSettings

    path = resolve_model("tiny-random")
    engine = null_engine(AutoTokenizer.from_pretrained(path), reply=" ".join(["word"] * max_tokens))
    out: dict[str, list[float]] = {api: [] for api in APIS}
    with tempfile.TemporaryDirectory() as tmp:
        config = ServerConfig(model=str(path), served_model_name="bench", port=free_port(), data_dir=Path(tmp),
                              admin_token="bench-admin-token-0123456789", lease_seconds=3600,
                              training=TrainingSettings(group_size=1024, batch_groups=1024, min_group_size=1024))
        bg = BackgroundServer(SwarmServer(config, engine)).start()

        async def one(api: str) -> float:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=bg.app), base_url="http://bench") as http:
                ep = (await http.post("/swarm/v1/episodes", json={"client_id": "bench", "task_id": "t"})).json()
                headers = {"Authorization": f"Bearer {ep['api_key']}"}
                bodies = [request(api, i, max_tokens, i, stream) for i in range(calls)]
                cpu0 = time.thread_time()
                for path_, body in bodies:
                    (await http.post(path_, json=body, headers=headers)).raise_for_status()
                cpu = time.thread_time() - cpu0
                await http.post(f"/swarm/v1/episodes/{ep['episode_id']}/abort", json={}, headers=headers)
            return 1e6 * cpu / calls

        try:
            for api in APIS:
                bg.call(one(api))  # untimed
            for rep in range(repeats):
                for api in APIS[rep % len(APIS):] + APIS[:rep % len(APIS)]:
                    us = bg.call(one(api))
                    assert isinstance(us, float)
                    out[api].append(us)
                    print(f"  {api:9s} round {rep}: {us:7.0f} us CPU per call", file=sys.stderr, flush=True)
        finally:
            bg.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--stream", action="store_true", help="the streamed routes (each API's own events)")
    p.add_argument("--engine", choices=["hf", "null"], default="hf", help="null: the server's own cost alone")
    p.add_argument("--calls", type=int, default=1, help="calls per client, one after the other (--asgi: per round, "
                   "default 300)")
    p.add_argument("--asgi", action="store_true", help="the routes' CPU per call, in this process (see above)")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    device = torch.device(args.device)
    if args.asgi:
        per_call = asgi_cpu(args.calls if args.calls > 1 else 300, args.repeats, args.max_tokens, args.stream)
        summary = {api: {"cpu_us_per_call": statistics.median(v), "rounds": v,
                         "calls_per_cpu_second_to_chat": statistics.median(
                             c / a for a, c in zip(v, per_call["chat"], strict=True))} for api, v in per_call.items()}
        for api, row in summary.items():
            print(f"{api:9s} {row['cpu_us_per_call']:7.0f} us CPU per call  "
                  f"{row['calls_per_cpu_second_to_chat']:.3f}x chat's calls per CPU second")
        out = args.output or RESULTS / f"harness_apis_asgi_cpu{'_stream' if args.stream else ''}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"commit": provenance.git_commit(ROOT), "machine": provenance.machine(),
                                   "device": provenance.device(), "args": vars(args), "summary": summary},
                                  indent=2, default=str) + "\n")
        print(f"wrote {out}")
        return

    from agentjet.runtime.launch import ServerProcess, free_port
    from agentjet.settings import ServerConfig

    path = model_path(args.model, torch.bfloat16 if device.type == "cuda" else torch.float32, MODEL_ROOT)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = ServerConfig.model_validate({
            "model": str(path), "served_model_name": "bench", "port": free_port(), "data_dir": tmp,
            "log_level": "WARNING", "lease_seconds": 3600, "placement": {"device": args.device},
            "generator": {"max_batch_size": args.concurrency, "kind": args.engine,
                          "null_reply": " ".join(["word"] * args.max_tokens)},
            "admin_token": "bench-admin-token-0123456789",
            "training": {"group_size": 1024, "batch_groups": 1024, "min_group_size": 1024}})
        server = ServerProcess("bench", config, Path(tmp) / "server.log", Path(tmp) / "server.yaml").start()
        try:
            server.wait_ready(600)
            for api in APIS:  # untimed: every route once at the timed length
                asyncio.run(one_round(server.url, api, args.concurrency, args.max_tokens, 99, args.stream, args.calls))
            for rep in range(args.repeats):
                order = APIS[rep % len(APIS):] + APIS[:rep % len(APIS)]
                for api in order:
                    r = asyncio.run(one_round(server.url, api, args.concurrency, args.max_tokens, rep, args.stream,
                                              args.calls, server.pid))
                    rows.append(r)
                    print(f"  {api:9s} round {rep}: {r['tokens']:6d} tokens {r['seconds']:7.2f} s "
                          f"{r['tok_s']:8.1f} tok/s  server CPU {r['server_cpu_ms_per_call']:.2f} ms/call",
                          file=sys.stderr, flush=True)
        finally:
            server.stop(grace=30)

    def of(api: str) -> list[dict[str, Any]]:
        return [r for r in rows if r["api"] == api]

    summary: dict[str, Any] = {"concurrency": args.concurrency, "stream": args.stream, "target": 0.95}
    for api in APIS:
        ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(of(api), of("chat"), strict=True)]
        summary[api] = {"tok_s": statistics.median(r["tok_s"] for r in of(api)),
                        "calls_s": statistics.median(r["calls_s"] for r in of(api)),
                        "server_cpu_ms_per_call": statistics.median(r["server_cpu_ms_per_call"] for r in of(api)),
                        "cpu_ratio_to_chat": statistics.median(b["server_cpu_ms_per_call"] / a["server_cpu_ms_per_call"]
                                                               for a, b in zip(of(api), of("chat"), strict=True)),
                        "ratio_to_chat": statistics.median(ratios), "ratios": ratios,
                        "same_tokens_as_chat": [a["per_call"] == b["per_call"]
                                                for a, b in zip(of(api), of("chat"), strict=True)]}
    for api in APIS:
        s = summary[api]
        print(f"{api:9s} {s['tok_s']:8.1f} tok/s {s['calls_s']:7.1f} calls/s  {s['ratio_to_chat']:.3f}x chat  "
              f"server CPU {s['server_cpu_ms_per_call']:.2f} ms/call ({s['cpu_ratio_to_chat']:.3f}x chat's "
              f"calls per CPU second)  same tokens: {all(s['same_tokens_as_chat'])}")
    name = "null" if args.engine == "null" else args.model.replace(".", "")
    out = args.output or RESULTS / f"harness_apis_{device.type}_{name}{'_stream' if args.stream else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"commit": provenance.git_commit(ROOT), "machine": provenance.machine(),
                               "device": provenance.device(), "environment": machine(device),
                               "args": vars(args), "rows": rows, "summary": summary}, indent=2, default=str) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
