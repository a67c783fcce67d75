"""The trainer group's recovery snapshot: ``torch.distributed.checkpoint`` writing a model's and its AdamW state, as
the ranks wrote it before (one thread, files synced), with several threads (synced: a run's checkpoint, or a group
over several nodes), and as a one-node group writes it now (several threads, not synced:
``RankTrainer.save(durable=False)``), in one run, taking turns.

    .venv/bin/python benchmarks/training/snapshot_write.py                 # 135M shapes, fp32, into /dev/shm
    .venv/bin/python benchmarks/training/snapshot_write.py --dir /tmp      # onto the disk instead

The state: a random-weight model with SmolLM2-135M's shapes in fp32 and AdamW's two moments for every weight
(after one optimizer step), on ``--device``: what one rank of a one-rank group holds. Figures: seconds per save,
medians of ``--rounds``, and the ratios to before. A plain state dict, not the FSDP2 shards the ranks save (the
writer's work is the same: one file per rank, one entry per tensor).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # workloads.py

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from workloads import MODEL_ROOT, RESULTS, machine, model_path  # noqa: E402

from agentjet.distributed.worker import snapshot_writer_threads  # noqa: E402


def state(model_name: str, device: torch.device) -> dict[str, dict]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path(model_name, torch.float32, MODEL_ROOT),
                                                 dtype=torch.float32).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # the moments exist
    return {"model": model.state_dict(), "optim": opt.state_dict()}


WAYS = {"before": (1, True), "threads": (snapshot_writer_threads(), True), "now": (snapshot_writer_threads(), False)}


def save(st: dict, path: Path, way: str) -> float:
    threads, synced = WAYS[way]
    start = time.perf_counter()
    dcp.save(st, storage_writer=dcp.FileSystemWriter(str(path), sync_files=synced, thread_count=threads))
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="135m")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dir", type=Path, default=Path("/dev/shm") if Path("/dev/shm").is_dir() else None)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--output", type=Path, default=RESULTS / "snapshot_write.json")
    args = p.parse_args()
    device = torch.device(args.device)
    st = state(args.model, device)
    nbytes = sum(t.numel() * t.element_size() for t in st["model"].values())
    nbytes += sum(v.numel() * v.element_size() for s in st["optim"]["state"].values() for v in s.values()
                  if isinstance(v, torch.Tensor))
    root = Path(tempfile.mkdtemp(prefix="aj-snapshot-", dir=args.dir))
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    try:
        for r in range(args.rounds + 1):  # round 0 warms up all (first file creation, page cache)
            for side in list(WAYS) if r % 2 == 0 else list(reversed(WAYS)):
                target = root / f"{side}-{r}"
                seconds = save(st, target, side)
                shutil.rmtree(target)
                if r:
                    times[side].append(seconds)
                print(f"  round {r} {side:6s} {seconds:.3f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratios = {way: [x / b for x, b in zip(times[way], times["before"], strict=True)] for way in WAYS}
    result = {"machine": machine(device), "model": args.model, "state_bytes": nbytes, "dir": str(root.parent),
              "ways": {w: {"threads": t, "synced": s} for w, (t, s) in WAYS.items()}, "seconds": times,
              "median_s": {w: statistics.median(times[w]) for w in WAYS},
              "ratio_to_before": {w: statistics.median(ratios[w]) for w in WAYS}, "ratios": ratios}
    print(f"snapshot of {nbytes / 2**30:.2f} GiB into {root.parent}, median of {args.rounds}:")
    for w, (t, synced) in WAYS.items():
        print(f"  {w:8s} {t} thread(s), {'synced' if synced else 'not synced':10s} {result['median_s'][w]:.3f} s "
              f"{result['ratio_to_before'][w]:.2f}x")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
