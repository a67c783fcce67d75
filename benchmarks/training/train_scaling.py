"""Trainer-group scaling: train-step time per trained token, single process vs FSDP2 ranks, from one run.

How to run (heavy: take the shared CPU lock)::

    flock /tmp/aj-cpu.lock .venv/bin/python benchmarks/training/train_scaling.py               # SmolLM2-135M, CPU
    flock /tmp/aj-cpu.lock .venv/bin/python benchmarks/training/train_scaling.py --model tiny-random --rounds 2  # smoke
    .venv/bin/python benchmarks/training/train_scaling.py --device cuda --procs 1               # N=1 on one GPU

It prints a table and writes ``benchmarks/results/train_scaling.json`` (``train_scaling_cuda.json`` with
``--device cuda``).

What is measured. One batch of ``--batch`` sequences x ``--length`` tokens, every position but the first
trained (random advantages, fixed behaviour logprobs: timing does not depend on their values), goes through:

* **plain** - the embedded layout's ``train_step`` in this process, with all ``--threads`` torch threads;
* **fsdp N** - a :class:`~agentjet.distributed.TrainerGroup` of N ranks (``fully_shard`` per decoder layer and
  on the root, gloo on CPU), each rank with ``--threads / N`` threads, so every configuration uses the same
  cores. The step time is the parent's round trip of the train phase (batch sent, forward/backward on every
  rank, gradient reduce-scatter, all-reduced metrics, clipped AdamW step); the push (rank 0 writes the full
  weights as safetensors, every rank writes its shard of model + optimizer to the recovery snapshot) is
  reported on its own, since the single-process engine has no equivalent.

The configurations take turns within each round (plain, fsdp 1, fsdp 2, plain, ...) after one warm-up step
each, so a slow phase of a shared machine hits all of them; times are medians over rounds and each ratio is
the median of the per-round ratios against plain. The JSON also records the bytes FSDP moves per step and
rank (parameter all-gathers in forward and backward, gradient reduce-scatter), the input of the 8-GPU
estimate in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import agentjet  # noqa: F401  (before torch: the process-wide OpenMP defaults, as in the server)

# isort: split
import torch

from agentjet.distributed import LearnerGroupSettings, TrainerGroup
from agentjet.engines.base import TrainSample
from agentjet.layouts import embedded_engine
from agentjet.learners.policy_step import StepConfig
from agentjet.models import resolve_model
from agentjet.runtime.blocking import run_blocking
from agentjet.runtime.provenance import git_commit
from agentjet.settings import LearnerSettings, LossSettings, PlacementSettings

RESULTS = Path(__file__).resolve().parents[1] / "results"


def make_batch(vocab: int, batch: int, length: int, seed: int = 0) -> list[TrainSample]:
    rng = random.Random(seed)
    out = []
    for _ in range(batch):
        ids = [rng.randrange(3, vocab) for _ in range(length)]
        mask = [0] + [1] * (length - 1)
        out.append(TrainSample(ids, mask, [0.0] + [-2.0] * (length - 1),
                               [0.0] + [rng.uniform(-1, 1) for _ in range(length - 1)]))
    return out


def fsdp_traffic(model: torch.nn.Module, n: int, n_micro: int, param_bytes: int, grad_bytes: int) -> dict[str, float]:
    """Bytes each rank receives per step: decoder layers are all-gathered in forward and again in backward
    (resharded after forward), the root's parameters (embeddings, head, final norm) once; gradients are
    reduce-scattered once per pass. A rank already holds 1/n of everything."""
    layers = {id(p) for name in (getattr(model, "_no_split_modules", None) or ())
              for m in model.modules() if type(m).__name__ == name for p in m.parameters()}
    params = {id(p): p.numel() for p in model.parameters()}
    p_layers = sum(v for k, v in params.items() if k in layers)
    p_root = sum(params.values()) - p_layers
    share = (n - 1) / n
    gathered = n_micro * (2 * p_layers + p_root) * param_bytes * share
    reduced = n_micro * (p_layers + p_root) * grad_bytes * share
    return {"params": float(p_layers + p_root), "params_layers": float(p_layers), "params_root": float(p_root),
            "all_gather_bytes_per_rank": gathered, "reduce_scatter_bytes_per_rank": reduced}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--length", type=int, default=128, help="tokens per sequence")
    p.add_argument("--rounds", type=int, default=3, help="timed steps per configuration (after one warm-up)")
    p.add_argument("--procs", default="1,2", help="trainer-group sizes to run (comma-separated)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads per configuration")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    procs = [int(x) for x in args.procs.split(",") if x.strip()]
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("--device cuda: no CUDA device is visible")
        procs = [n for n in procs if n <= torch.cuda.device_count()]
    output = args.output or RESULTS / ("train_scaling.json" if args.device == "cpu" else "train_scaling_cuda.json")
    torch.set_num_threads(args.threads)
    bf16 = args.device == "cuda"  # plain: bf16 autocast; the group: FSDP2's bf16 MixedPrecisionPolicy
    learner = LearnerSettings(autocast_bf16=bf16, learning_rate=1e-6)
    config = StepConfig.from_settings(learner, LossSettings())
    path = resolve_model(args.model)

    plain = embedded_engine(path, None, learner, LossSettings(), PlacementSettings(device=args.device, dtype="float32"))
    vocab = len(plain.tokenizer)
    batch = make_batch(vocab, args.batch, args.length)
    tokens = sum(s.num_trained_tokens for s in batch)
    groups: dict[int, TrainerGroup] = {}
    startup: dict[int, float] = {}
    try:
        for n in procs:
            settings = LearnerGroupSettings(procs=n, device=args.device, startup_timeout_s=600, step_timeout_s=1800,
                                            push_timeout_s=1800, collective_timeout_s=1800,
                                            threads_per_rank=max(1, args.threads // n) if args.device == "cpu"
                                            else None)
            t0 = time.perf_counter()
            groups[n] = TrainerGroup(path, settings, config)
            groups[n].start()
            startup[n] = time.perf_counter() - t0
            print(f"fsdp {n}: ranks ready in {startup[n]:.1f} s", flush=True)

        def plain_step() -> dict[str, float]:
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            run_blocking(plain.train_step(batch))
            if args.device == "cuda":
                torch.cuda.synchronize()
            return {"step_seconds": time.perf_counter() - t0, "push_seconds": 0.0}

        def group_step(group) -> dict[str, float]:
            """The parent's round trip (``group_step_seconds``) is the step; rank 0's loop is ``train_seconds``."""
            m = group.train_step(batch)
            return {"step_seconds": m["group_step_seconds"], "push_seconds": m["push_seconds"],
                    "train_seconds": m["step_seconds"]}

        runs: dict[str, list[dict[str, float]]] = {"plain": [], **{f"fsdp {n}": [] for n in procs}}
        for r in range(args.rounds + 1):
            results = {"plain": plain_step(), **{f"fsdp {n}": group_step(g) for n, g in groups.items()}}
            if r == 0:
                print("warm-up done", flush=True)
                continue
            for name, m in results.items():
                runs[name].append(m)
            print(f"round {r}: " + ", ".join(f"{k} {v['step_seconds']:.2f} s" for k, v in results.items()), flush=True)
        n_micro = {n: int(runs[f"fsdp {n}"][0]["micro_batches"]) for n in procs}
    finally:
        for g in groups.values():
            g.close()

    rows: dict[str, dict[str, Any]] = {}
    for name, ms in runs.items():
        steps = [m["step_seconds"] for m in ms]
        ratios = [m["step_seconds"] / base["step_seconds"] for m, base in zip(ms, runs["plain"], strict=True)]
        rows[name] = {
            "step_seconds": statistics.median(steps), "step_seconds_all": steps,
            "ms_per_token": 1000 * statistics.median(steps) / tokens,
            "ratio_vs_plain": statistics.median(ratios), "ratios_all": ratios,
            "push_seconds": statistics.median(m["push_seconds"] for m in ms),
        }
    param_bytes = 2 if bf16 else 4
    for n in procs:
        name = f"fsdp {n}"
        rows[name]["ranks"] = n
        rows[name]["startup_seconds"] = startup[n]
        rows[name]["micro_batches"] = n_micro[n]
        rows[name]["rank_train_seconds"] = statistics.median(m["train_seconds"] for m in runs[name])
        rows[name]["export_seconds"] = statistics.median(m["export_seconds"] for m in runs[name])
        rows[name]["snapshot_seconds"] = statistics.median(m["snapshot_seconds"] for m in runs[name])
        rows[name]["traffic"] = fsdp_traffic(plain.model, n, n_micro[n], param_bytes, 4)

    result = {
        "benchmark": "train_scaling", "model": args.model, "device": args.device, "batch": args.batch,
        "length": args.length, "trained_tokens_per_step": tokens, "rounds": args.rounds, "threads": args.threads,
        "commit": git_commit(Path(__file__).resolve().parents[2]), "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None},
        "results": rows,
    }
    print()
    print(f"{args.model} on {args.device}: {args.batch} x {args.length} tokens ({tokens} trained) per step, "
          f"{args.rounds} rounds, {args.threads} threads per configuration")
    print(f"{'':10} {'step s':>8} {'ms/token':>9} {'vs plain':>9} {'push s':>8} {'gathered MiB/rank':>17}")
    for name, row in rows.items():
        gathered = row.get("traffic", {}).get("all_gather_bytes_per_rank")
        print(f"{name:10} {row['step_seconds']:8.2f} {row['ms_per_token']:9.2f} {row['ratio_vs_plain']:8.2f}x "
              f"{row['push_seconds']:8.2f} {(f'{gathered / 2**20:.0f}' if gathered is not None else '-'):>17}")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
