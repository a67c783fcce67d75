"""The RL loop's own throughput on one GPU: ``ajet server`` with the embedded engine, a scripted swarm client, and
the two ceilings the loop cannot beat, measured in the same command.

    python benchmarks/training/rl_loop.py --device cuda --model 1.7b          # issue 52's stage: 64 episodes, 3 min
    python benchmarks/training/rl_loop.py --device cpu --model tiny-random --concurrency 8 --group-size 4 \\
        --new-tokens 16 --seconds 20                                          # a rehearsal on the CPU

Random-init weights cannot show learning, so this measures the loop instead. Three phases, one after the other
(so none shares the device with another):

1. **Generation alone** (a child process): the embedded engine with the server's generator settings, ``c`` clients
   each sending its next request when the last returns, the loop's prompt (the chat template of the client's
   message) and ``--new-tokens`` new tokens: generated tokens/s, ``gen``.
2. **The train step alone** (the same child): ``train_step`` on a batch of the loop's shape (``batch_groups x
   group_size`` samples of the prompt and ``--new-tokens`` generated tokens, the loss on those): trained tokens/s,
   ``train`` (median of ``--train-steps`` steps after a warm-up step).
3. **The loop**: ``ajet server`` in its own process (the same settings), and ``c`` scripted episodes at once, each
   client beginning its next episode when the last ends: one chat call of ``--new-tokens`` tokens, then a fixed
   reward that differs inside each group (``k / (group_size - 1)`` for the group's k-th client), so no group is
   dropped as uniform. After ``--warmup-steps`` committed steps the window opens for ``--seconds`` (closed at the
   next committed step; shortened, and said so, when ``--time-limit-s`` would not leave room for it), and the
   server's own counters (``GET /swarm/v1/status``) give the figures over it:
   trained and generated tokens per second, and the share of the window's wall time spent generating (the
   generator's engine thread in admission and decode steps: ``generator_admit_us + generator_decode_us``), in
   train steps (``train_seconds``) and in weight pushes (``weight_sync_seconds``; the in-place seam of this
   layout moves nothing, so it is about 0 here by construction). The rest is the engine thread idle: waiting for
   calls (the HTTP path, the client's turnaround between episodes) or for a batch to be ready.

**The ceiling.** On one device the embedded layout generates and trains in turn, so each trained token costs a
generated token at ``gen`` plus a trained token at ``train``: the loop cannot train faster than
``1 / (r / gen + 1 / train)`` trained tokens/s, with ``r`` the generated tokens per trained token (1 here: every
generated token is trained; the measured ``r`` is used). Target: the loop at >= 0.8x of it. The JSON also says
how fast each part ran inside the loop (generated tokens per second of generation time against ``gen``; trained
tokens per second of train time against ``train``) and how much time was idle: what holds the loop back.

Prints a table; writes JSON (``--output``, default ``benchmarks/results/rl_loop_<device>_<model>.json``) with the
machine, the device and the commit (``agentjet.runtime.provenance``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # workloads.py

from agentjet.runtime.omp import prefer_passive_openmp  # noqa: E402

prefer_passive_openmp()  # before torch loads, as in the server

# isort: split
import httpx  # noqa: E402
import torch  # noqa: E402
from workloads import MODEL_ROOT, RESULTS, machine, model_path  # noqa: E402

from agentjet.runtime import provenance  # noqa: E402

MESSAGE = "Write a long, detailed story about a lighthouse keeper and the ships that pass at night."
ADMIN = "rl-loop-admin-token-0123456789"
TARGET = 0.8
LIMIT_RESERVE_S = 45.0  # of --time-limit-s, kept for the step that closes the window, the server's stop, the JSON


def settings_dicts(args: argparse.Namespace) -> dict[str, Any]:
    """The generator, learner and placement settings both the server and the ceilings' engine get."""
    return {"generator": {"max_batch_size": args.concurrency, "kv_cache_tokens": args.cache_tokens},
            "learner": {"learning_rate": 1e-6}, "placement": {"device": args.device}}


# =========================================================================== phases 1-2: the ceilings (a child)
def child_ceilings(args: argparse.Namespace) -> dict[str, Any]:
    from agentjet.engines.base import SamplingParams, TrainSample
    from agentjet.layouts import embedded_engine
    from agentjet.runtime.blocking import run_blocking
    from agentjet.server.episodes.chat import ChatFormatter
    from agentjet.settings import GeneratorSettings, LearnerSettings, PlacementSettings

    s = settings_dicts(args)
    engine = embedded_engine(Path(args.model_path), GeneratorSettings(**s["generator"]), LearnerSettings(**s["learner"]),
                             placement=PlacementSettings(**s["placement"]))
    try:
        prompt = ChatFormatter(engine.tokenizer).prompt_ids([{"role": "user", "content": MESSAGE}], None)

        async def round_(seed: int) -> tuple[int, float]:
            async def one(i: int) -> int:
                n = 0
                for k in range(args.ceiling_calls):
                    r = await engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=args.new_tokens,
                                                                     seed=seed * 10_000 + k * 1000 + i))
                    n += len(r.token_ids)
                return n

            t0 = time.perf_counter()
            tokens = sum(await asyncio.gather(*(one(i) for i in range(args.concurrency))))
            return tokens, time.perf_counter() - t0

        run_blocking(round_(0))  # untimed: each batch size's CUDA graphs are captured on first use
        gen = [run_blocking(round_(1 + r)) for r in range(args.ceiling_rounds)]
        print(f"  generation alone: {[round(t / s_) for t, s_ in gen]} tok/s", file=sys.stderr, flush=True)

        g = torch.Generator().manual_seed(0)
        vocab = len(engine.tokenizer)
        batch = []
        for i in range(args.concurrency // args.group_size * args.group_size):
            reply = torch.randint(3, vocab, (args.new_tokens,), generator=g).tolist()
            adv = ((i % args.group_size) / max(args.group_size - 1, 1)) - 0.5
            batch.append(TrainSample(prompt + reply, [0] * len(prompt) + [1] * len(reply),
                                     [0.0] * len(prompt) + [-3.0] * len(reply), [0.0] * len(prompt) + [adv] * len(reply)))
        for s_, lps in zip(batch, run_blocking(engine.learner.score(batch)), strict=True):
            assert len(lps) == len(s_.input_ids) - len(prompt)
            s_.behaviour_logprobs = [0.0] * len(prompt) + lps  # the policy's own, as after a rollout
        tokens = sum(x.num_trained_tokens for x in batch)
        steps = []
        for i in range(args.train_steps + 1):
            _sync(args.device)
            t0 = time.perf_counter()
            run_blocking(engine.train_step(batch))
            _sync(args.device)
            if i:
                steps.append(time.perf_counter() - t0)
        print(f"  train step alone: {[round(x, 3) for x in steps]} s for {tokens} trained tokens", file=sys.stderr,
              flush=True)
        return {"prompt_tokens": len(prompt), "generation_rounds": [{"tokens": t, "seconds": s_} for t, s_ in gen],
                "gen_tok_s": statistics.median(t / s_ for t, s_ in gen), "train_batch_samples": len(batch),
                "train_batch_tokens": tokens, "train_step_seconds": steps,
                "train_tok_s": tokens / statistics.median(steps),
                "micro_batch_tokens": engine.learner.micro_batch_tokens}
    finally:
        run_blocking(engine.close())


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def ceilings(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", "--model-path", str(path), *_forwarded(args)]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _forwarded(args: argparse.Namespace) -> list[str]:
    return ["--device", args.device, "--concurrency", str(args.concurrency), "--group-size", str(args.group_size),
            "--new-tokens", str(args.new_tokens), "--cache-tokens", str(args.cache_tokens),
            "--ceiling-rounds", str(args.ceiling_rounds), "--ceiling-calls", str(args.ceiling_calls),
            "--train-steps", str(args.train_steps)]


# =========================================================================== phase 3: the loop
COUNTERS = ("trained_tokens", "generated_tokens", "train_seconds", "weight_sync_seconds", "generator_admit_us",
            "generator_decode_us", "calls", "episodes_ended")


async def read_status(http: httpx.AsyncClient) -> dict[str, Any]:
    r = await http.get("/swarm/v1/status", headers={"Authorization": f"Bearer {ADMIN}"})
    r.raise_for_status()
    return r.json()


def counters(status: dict[str, Any], at: float) -> dict[str, float]:
    t = status["throughput"]
    return {"at": at, "train_steps": float(status["train_steps"]), **{k: float(t.get(k, 0.0)) for k in COUNTERS},
            "dropped_uniform": float(status["buffer"]["dropped_uniform_episodes"]),
            "dropped_stale": float(status["buffer"]["dropped_stale_episodes"])}


async def client(url: str, worker: int, args: argparse.Namespace, stop: asyncio.Event, errors: list[str]) -> None:
    """One scripted client: episodes one after the other, one chat call each, the group's k-th reward."""
    from agentjet.client import SwarmClient

    slot, k = divmod(worker, args.group_size)
    reward = k / max(args.group_size - 1, 1)
    n = 0
    async with SwarmClient(url, client_id=f"loop-{worker}") as swarm, \
            httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0)) as http:
        while not stop.is_set():
            async with swarm.episode(task_id=f"t{slot}-{n}") as ep:
                r = await http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {ep.api_key}"},
                                    json={"model": "loop", "messages": [{"role": "user", "content": MESSAGE}],
                                          "max_tokens": args.new_tokens, "temperature": 1.0,
                                          "seed": worker * 100_000 + n})
                if r.status_code != 200:
                    errors.append(f"{r.status_code}: {r.text[:200]}")
                ep.reward(reward)
            n += 1


async def drive(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The scripted clients, and the window over the server's counters (from a committed step to another)."""
    stop = asyncio.Event()
    errors: list[str] = []
    tasks = [asyncio.create_task(client(url, w, args, stop, errors)) for w in range(args.concurrency)]
    start = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        async def commit_after(steps: int, deadline_s: float) -> dict[str, float]:
            """The counters at the first moment the server has committed ``steps`` steps."""
            while True:
                if any(t.done() for t in tasks):  # a client failed: say so, do not wait out the deadline
                    for t in tasks:
                        if t.done() and t.exception() is not None:
                            raise RuntimeError(f"a scripted client failed: {t.exception()!r}")
                st = await read_status(http)
                if st["train_steps"] >= steps:
                    return counters(st, time.perf_counter())
                if time.perf_counter() - start > deadline_s:
                    raise TimeoutError(f"{st['train_steps']} train steps after {deadline_s:.0f} s (waiting for {steps}); "
                                       f"status: {json.dumps(st['buffer'])}")
                await asyncio.sleep(args.poll_s)

        first = await commit_after(args.warmup_steps, args.warmup_timeout_s)
        window = args.seconds
        if args.time_limit_s is not None:  # room for the last step, the stop and the JSON: the last minute's
            window = max(min(window, args.time_limit_s - (time.perf_counter() - args.started) - LIMIT_RESERVE_S), 5.0)
        if window < args.seconds:
            print(f"  the window is cut to {window:.0f} s (of {args.seconds:.0f}) to end within the {args.time_limit_s:.0f} s "
                  "limit", file=sys.stderr, flush=True)
        while time.perf_counter() - first["at"] < window:
            await asyncio.sleep(args.poll_s)
        last_seen = counters(await read_status(http), time.perf_counter())
        last = await commit_after(int(last_seen["train_steps"]) + 1, args.warmup_timeout_s + 2 * args.seconds + 600)
        final = await read_status(http)
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"first": first, "last": last, "window_asked_s": args.seconds, "window_planned_s": window,
            "errors": errors[:10], "error_count": len(errors),
            "engine_info": final.get("engine_info", {}), "last_train_metrics": final.get("last_train_metrics", {})}


def run_loop(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    from agentjet.runtime.launch import ServerProcess, free_port
    from agentjet.settings import ServerConfig

    s = settings_dicts(args)
    with tempfile.TemporaryDirectory(prefix="rl-loop-") as tmp:
        config = ServerConfig.model_validate({
            "model": str(path), "served_model_name": "loop", "port": free_port(), "data_dir": tmp,
            "log_level": "WARNING", "lease_seconds": 3600, "admin_token": ADMIN, **s,
            "training": {"group_size": args.group_size, "batch_groups": args.concurrency // args.group_size,
                         "min_group_size": args.group_size, "checkpoint_every": 0,
                         "max_staleness": args.max_staleness}})
        server = ServerProcess("rl-loop", config, Path(tmp) / "server.log", Path(tmp) / "server.yaml").start()
        try:
            server.wait_ready(600)
            out = asyncio.run(drive(server.url, args))
        except BaseException:
            print(f"  the server's log, last lines:\n{(Path(tmp) / 'server.log').read_text()[-3000:]}",
                  file=sys.stderr, flush=True)
            raise
        finally:
            server.stop(grace=5)  # no final checkpoint wanted: SIGKILL after 5 s
    return out


# =========================================================================== figures
def figures(ceil: dict[str, Any], loop: dict[str, Any]) -> dict[str, Any]:
    a, b = loop["first"], loop["last"]
    wall = b["at"] - a["at"]
    d = {k: b[k] - a[k] for k in b if k != "at"}
    gen_s = (d["generator_admit_us"] + d["generator_decode_us"]) / 1e6
    train_s, sync_s = d["train_seconds"], d["weight_sync_seconds"]
    r = d["generated_tokens"] / d["trained_tokens"] if d["trained_tokens"] else float("nan")
    ceiling = 1.0 / (r / ceil["gen_tok_s"] + 1.0 / ceil["train_tok_s"])
    trained_tok_s = d["trained_tokens"] / wall
    return {
        "window_s": wall, "window_asked_s": loop["window_asked_s"], "train_steps": d["train_steps"],
        "trained_tok_s": trained_tok_s,
        "generated_tok_s": d["generated_tokens"] / wall, "generated_per_trained": r,
        "share": {"generation": gen_s / wall, "train_step": train_s / wall, "weight_sync": sync_s / wall,
                  "idle": 1.0 - (gen_s + train_s + sync_s) / wall},
        "gen_ceiling_tok_s": ceil["gen_tok_s"], "train_ceiling_tok_s": ceil["train_tok_s"],
        "implied_ceiling_trained_tok_s": ceiling, "vs_ceiling": trained_tok_s / ceiling, "target": TARGET,
        "met": trained_tok_s / ceiling >= TARGET,
        # how fast each part ran inside the loop, against its ceiling
        "gen_tok_s_while_generating": d["generated_tokens"] / gen_s if gen_s else None,
        "train_tok_s_while_training": d["trained_tokens"] / train_s if train_s else None,
        "dropped_uniform": d["dropped_uniform"], "dropped_stale": d["dropped_stale"],
        "episodes": d["episodes_ended"], "calls": d["calls"],
    }


def render(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    f, a = result["figures"], result["args"]
    t = Table(title=f"RL loop on {result['device']}: {a['model']}, {a['concurrency']} episodes at once, groups of "
                    f"{a['group_size']}, {a['new_tokens']} new tokens a call, {f['window_s']:.0f} s window (asked: "
                    f"{f['window_asked_s']:.0f}) "
                    f"({f['train_steps']:.0f} steps)")
    for col in ("", "loop", "ceiling (alone)", "loop / ceiling"):
        t.add_column(col, justify="right")
    gw, tw = f["gen_tok_s_while_generating"], f["train_tok_s_while_training"]
    t.add_row("trained tokens/s", f"{f['trained_tok_s']:.0f}", f"{f['implied_ceiling_trained_tok_s']:.0f} (implied)",
              f"{f['vs_ceiling']:.2f}x (target >= {TARGET}x)")
    t.add_row("generated tokens/s", f"{f['generated_tok_s']:.0f}", "", "")
    t.add_row("generation: tokens/s while generating", f"{gw:.0f}" if gw else "-", f"{f['gen_ceiling_tok_s']:.0f}",
              f"{gw / f['gen_ceiling_tok_s']:.2f}x" if gw else "-")
    t.add_row("train step: trained tokens/s while training", f"{tw:.0f}" if tw else "-",
              f"{f['train_ceiling_tok_s']:.0f}", f"{tw / f['train_ceiling_tok_s']:.2f}x" if tw else "-")
    for name, share in f["share"].items():
        t.add_row(f"share of wall time: {name.replace('_', ' ')}", f"{share:.1%}", "", "")
    Console(width=140).print(t)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="1.7b", help="1.7b or 135m (random weights, SmolLM2 shapes), tiny-random, "
                   "or a local HF directory")
    p.add_argument("--concurrency", type=int, default=64, help="episodes at once (and the generator's slots)")
    p.add_argument("--group-size", type=int, default=8, help="episodes per group; a step takes concurrency / "
                   "group_size groups")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens generated per call (the episode's one call)")
    p.add_argument("--seconds", type=float, default=180.0, help="the loop's measured window")
    p.add_argument("--warmup-steps", type=int, default=3, help="committed steps before the window opens (the first "
                   "ones capture CUDA graphs and allocate the optimizer's state)")
    p.add_argument("--warmup-timeout-s", type=float, default=600.0)
    p.add_argument("--max-staleness", type=int, default=4, help="the server's training.max_staleness")
    p.add_argument("--ceiling-rounds", type=int, default=3, help="timed rounds of generation alone")
    p.add_argument("--ceiling-calls", type=int, default=2, help="calls per client in a round of generation alone")
    p.add_argument("--train-steps", type=int, default=6, help="timed steps of the train step alone")
    p.add_argument("--cache-tokens", type=int, default=None, help="KV cache columns a slot (default: the prompt "
                   "and the new tokens, rounded up to 64)")
    p.add_argument("--time-limit-s", type=float, default=float(os.environ["STAGE_LIMIT_S"]) if os.environ.get(
        "STAGE_LIMIT_S") else None, help="end within this many seconds of the start, shortening the window if need be "
        "(default: $STAGE_LIMIT_S, which scripts/gpu_check.sh sets to the stage's limit; unset: no limit)")
    p.add_argument("--poll-s", type=float, default=0.25)
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model-path", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.concurrency % args.group_size:
        p.error("--concurrency must be a multiple of --group-size")
    return args


def prompt_tokens(path: Path) -> int:
    """The length of the loop's prompt: the model's chat template around the client's message."""
    from transformers import AutoTokenizer

    from agentjet.server.episodes.chat import ChatFormatter

    return len(ChatFormatter(AutoTokenizer.from_pretrained(path)).prompt_ids([{"role": "user", "content": MESSAGE}],
                                                                             None))


def main() -> None:
    args = parse_args()
    args.started = time.perf_counter()
    if args.child:
        print(json.dumps(child_ceilings(args)))
        return
    device = torch.device(args.device)
    path = model_path(args.model, torch.bfloat16 if device.type == "cuda" else torch.float32, MODEL_ROOT)
    # a slot holds the prompt and the reply without growing its cache (a grow replaces the CUDA graphs)
    args.cache_tokens = args.cache_tokens or -(-(prompt_tokens(path) + args.new_tokens + 16) // 64) * 64
    name = f"rl_loop_{device.type}_{args.model.replace('/', '_').replace('.', '')}"
    out = args.output or RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "benchmark": "rl_loop", "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                                         if k != "started"},
        "model_path": str(path), "commit": provenance.git_commit(Path(__file__).resolve().parents[2]),
        "machine": provenance.machine(), "device": provenance.device(), "environment": machine(device)}
    t0 = time.perf_counter()
    result["ceilings"] = ceilings(args, path)
    t1 = time.perf_counter()
    out.write_text(json.dumps({**result, "partial": "the ceilings only: the loop has not finished"}, indent=2,
                              default=str) + "\n")  # kept if the loop is cut short
    loop = result["loop"] = run_loop(args, path)
    result["figures"] = figures(result["ceilings"], loop)
    result["phase_seconds"] = {"ceilings": t1 - t0, "loop": time.perf_counter() - t1}
    render(result)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    if loop["error_count"]:
        sys.exit(f"{loop['error_count']} chat calls failed, e.g. {loop['errors'][:2]}")


if __name__ == "__main__":
    main()
