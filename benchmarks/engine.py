"""Engine benchmark: dynamic-batching generation throughput and train-step cost of ``HFEngine``.

How to run::

    .venv/bin/python benchmarks/engine.py            # full run, SmolLM2-135M-Instruct (~6 min on an idle 2-core CPU)
    .venv/bin/python benchmarks/engine.py --quick    # smaller run, a smoke test (~1.5 min)
    .venv/bin/python benchmarks/engine.py --threads 1  # one torch thread: see the note on shared machines
    .venv/bin/python benchmarks/engine.py --model tiny-random --quick

It prints a table and writes ``benchmarks/results/engine.json``.

What the numbers mean:

* **Generation** - N callers each ask ``engine.generate`` for ``--gen-tokens`` new tokens from a short chat
  prompt (different prompts and seeds, temperature 1). "serial" issues the same N requests one after
  another (each is a batch of one); "concurrent" issues them at once with ``asyncio.gather``, so the
  engine's batcher runs them as one left-padded batch. tok/s is aggregate generated tokens / wall time.
  The ratio is concurrent / serial, taken per repeat (serial and concurrent run back to back) and then the
  median across repeats, so machine noise mostly cancels. Target: >= 3.5x at concurrency 8.
* **Train step** - ``engine.train_step_sync`` on B sequences x L tokens (every position but the first
  trained, random advantages, behaviour logprobs from a no-grad scoring pass) against the *floor*: a plain
  ``AutoModelForCausalLM`` doing ``model(ids, labels=ids).loss.backward(); opt.step(); opt.zero_grad()``
  with AdamW on the same tokens. Both run in one fresh subprocess (so nothing the generation phase left in
  memory counts), each warms up once, then their ``--steps`` timed steps are interleaved (floor, ours, ours,
  floor, ...) so that a slow phase of the machine hits both. Times are medians; the ratio is the median of
  the per-step ratios ours / floor.
  Target: ours / floor <= 1.15x.
  Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` above what was allocated right before the
  step. On CPU, the peak RSS increase during the step: ``/proc/self/status`` VmHWM is reset (``clear_refs``)
  right before the step and compared with the RSS then (a 2 ms sampler thread if the reset is not
  permitted). The subprocess runs with a fixed glibc mmap threshold so that freed tensors go back to the OS
  and the next step's peak is measured from a clean baseline instead of being hidden by malloc's cache.

The machine may be shared: compare only the ratios, which are measured against a baseline in the same run.
On a 2-core CPU, another busy process makes the generation ratio collapse rather than just get noisy: the
batched decode's matmuls run as 2-thread OpenMP regions that spin-wait on the core the other process holds
(an [8, 576] x [576, 1536] matmul goes from 0.37 ms to ~16 ms), while batch-1 decode is mostly single-threaded
GEMV and barely slows down. ``--threads 1`` gives stable ratios on a loaded machine; run it without that
flag on an idle one for the headline numbers (and expect the full run to take ~30 min under load).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from agentjet.runtime import prefer_passive_openmp

prefer_passive_openmp()  # before torch loads: the process-wide OpenMP default, as in the server

# isort: split
import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "engine.json"

PROMPTS = [
    "Write a detailed story about a lighthouse keeper who finds a message in a bottle.",
    "Explain step by step how a refrigerator works.",
    "Describe the history of the printing press in several paragraphs.",
    "Give me a long list of tips for learning to play the guitar.",
    "Write an essay about why cities should plant more trees.",
    "Explain how photosynthesis works to a ten year old.",
    "Describe a day in the life of a medieval blacksmith.",
    "Write a long poem about the ocean at night.",
]


# --------------------------------------------------------------------------- memory measurement
class PeakMemory:
    """Peak memory increase (bytes) of the code inside the ``with`` block."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak_bytes = 0
        self.method = ""

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            self.method = "cuda.max_memory_allocated"
            return self
        self._base = _rss_bytes()
        self._sampler: threading.Thread | None = None
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM (peak RSS) to the current RSS
            self.method = "VmHWM reset"
        except OSError:
            self.method = "RSS sampler 2ms"
            self._stop = threading.Event()
            self._peak = self._base
            self._sampler = threading.Thread(target=self._sample, daemon=True)
            self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, _rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._base
        elif self._sampler is not None:
            self._stop.set()
            self._sampler.join()
            self.peak_bytes = max(self._peak, _rss_bytes()) - self._base
        else:
            self.peak_bytes = _hwm_bytes() - self._base


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        m = re.search(r"VmHWM:\s+(\d+)\s+kB", f.read())
    assert m is not None
    return int(m.group(1)) * 1024


# --------------------------------------------------------------------------- generation
async def _issue(engine: Any, prompts: list[list[int]], params: list[Any], concurrent: bool) -> tuple[int, float]:
    t0 = time.perf_counter()
    if concurrent:
        results = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True)))
    else:
        results = [await engine.generate(p, s) for p, s in zip(prompts, params, strict=True)]
    return sum(len(r.token_ids) for r in results), time.perf_counter() - t0


async def bench_generation(engine: Any, concurrencies: list[int], gen_tokens: int, repeats: int) -> list[dict]:
    from agentjet.engines.base import SamplingParams

    tok = engine.tokenizer
    chats = [
        list(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                     tokenize=True, return_dict=False))
        for text in PROMPTS
    ]

    def workload(n: int, rep: int) -> tuple[list[list[int]], list[Any]]:
        prompts = [chats[i % len(chats)] for i in range(n)]
        params = [SamplingParams(temperature=1.0, max_tokens=gen_tokens, seed=1000 * rep + i) for i in range(n)]
        return prompts, params

    # warm up: one batch of the largest size, one single request
    wp, wparams = workload(max(concurrencies), 99)
    await _issue(engine, wp, [SamplingParams(temperature=1.0, max_tokens=8, seed=s.seed) for s in wparams], True)
    await _issue(engine, wp[:1], [SamplingParams(temperature=1.0, max_tokens=8, seed=1)], False)

    rows = []
    for n in concurrencies:
        serial, conc, ratios, batches = [], [], [], []
        for rep in range(repeats):
            prompts, params = workload(n, rep)
            # alternate which side goes first so a slow phase of the machine hits both equally
            order = (False, True) if rep % 2 == 0 else (True, False)
            rates: dict[bool, float] = {}
            for concurrent in order:
                b0 = engine.stats["generate_batches"]
                tokens, secs = await _issue(engine, prompts, params, concurrent)
                if tokens != n * gen_tokens:
                    raise RuntimeError(f"expected {n * gen_tokens} generated tokens, got {tokens}")
                rates[concurrent] = tokens / secs
                if concurrent:
                    batches.append(engine.stats["generate_batches"] - b0)
            serial.append(rates[False])
            conc.append(rates[True])
            ratios.append(rates[True] / rates[False])
        row = {
            "concurrency": n,
            "tokens_per_request": gen_tokens,
            "serial_tok_s": statistics.median(serial),
            "concurrent_tok_s": statistics.median(conc),
            "ratio": statistics.median(ratios),
            "concurrent_batches": statistics.median(batches),
            "serial_tok_s_all": serial,
            "concurrent_tok_s_all": conc,
            "ratios_all": ratios,
        }
        rows.append(row)
        print(f"  generation c={n}: serial {row['serial_tok_s']:.1f} tok/s, concurrent "
              f"{row['concurrent_tok_s']:.1f} tok/s, ratio {row['ratio']:.2f}x", file=sys.stderr, flush=True)
    return rows


# --------------------------------------------------------------------------- train step (children)
def _train_tokens(vocab: int, batch: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g)


def _floor_step(path: Path, device: torch.device, ids: torch.Tensor):
    """The floor: a plain Hugging Face causal-LM step with AdamW, nothing else."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.999), weight_decay=0.0)
    ids = ids.to(device)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    return step


def _engine_step(path: Path, device: torch.device, ids: torch.Tensor, seed: int):
    """Ours: ``HFEngine.train_step_sync`` on the same tokens, every position but the first trained."""
    from agentjet.engines.base import TrainSample
    from agentjet.engines.hf import HFEngine
    from agentjet.settings import EngineSettings

    engine = HFEngine(path, EngineSettings(device=str(device), max_batch_size=8))
    g = torch.Generator().manual_seed(seed + 1)
    samples = []
    for row in ids.tolist():
        adv = (torch.randn(1, generator=g) + 0.1 * torch.randn(len(row), generator=g)).tolist()
        samples.append(TrainSample(row, [0] + [1] * (len(row) - 1), [0.0] * len(row), adv))
    # behaviour logprobs = the current policy's (a no-grad scoring pass), as right after a rollout
    for s, lps in zip(samples, engine.score(samples), strict=True):
        s.behaviour_logprobs = [0.0] + lps

    def step() -> None:
        engine.train_step_sync(samples)

    return step


def child_train(args: argparse.Namespace) -> dict:
    """Both sides of the train-step comparison, in one fresh process, their steps interleaved."""
    from transformers import AutoConfig

    from agentjet.models import resolve_model

    device = torch.device(args.device)
    path = resolve_model(args.model)
    ids = _train_tokens(AutoConfig.from_pretrained(path).vocab_size, args.batch, args.length, args.seed)
    steps = {"floor": _floor_step(path, device, ids), "ours": _engine_step(path, device, ids, args.seed)}
    times: dict[str, list[float]] = {"floor": [], "ours": []}
    peaks: dict[str, list[int]] = {"floor": [], "ours": []}
    method = ""
    for i in range(args.steps + 1):
        # alternate which side goes first; step 0 of each side is the warm-up (allocates the optimizer state)
        for side in ("floor", "ours") if i % 2 == 0 else ("ours", "floor"):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            with PeakMemory(device) as mem:
                t0 = time.perf_counter()
                steps[side]()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                elapsed = time.perf_counter() - t0
            method = mem.method
            if i > 0:
                times[side].append(elapsed)
                peaks[side].append(mem.peak_bytes)
            print(f"  train {side}: step {i}{' (warm-up)' if i == 0 else ''} {elapsed:.2f}s "
                  f"peak +{mem.peak_bytes / 2**20:.0f} MiB", file=sys.stderr, flush=True)
    return {"times": times, "peaks": peaks, "memory_method": method}


def bench_train(args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", "train", "--model", args.model, "--device", args.device,
           "--batch", str(args.batch), "--length", str(args.length), "--steps", str(args.steps),
           "--seed", str(args.seed)] + (["--threads", str(args.threads)] if args.threads else [])
    env = dict(os.environ)
    # A fixed mmap threshold (which also turns off glibc's dynamic one): large tensors are mmapped and given
    # back to the OS when freed, so each step's peak RSS is measured from a clean baseline instead of being
    # hidden by memory that malloc kept from the previous step. Same for both sides.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    env.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 20))
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    t, m = res["times"], res["peaks"]
    # steps i of the two sides ran back to back: their ratio is the least sensitive to machine noise
    ratios = [o / f for o, f in zip(t["ours"], t["floor"], strict=True)]
    floor_m, ours_m = statistics.median(m["floor"]), statistics.median(m["ours"])
    return {
        "batch": args.batch, "length": args.length, "steps": args.steps,
        "floor_seconds": statistics.median(t["floor"]), "ours_seconds": statistics.median(t["ours"]),
        "time_ratio": statistics.median(ratios),
        "floor_peak_mib": floor_m / 2**20, "ours_peak_mib": ours_m / 2**20, "memory_ratio": ours_m / floor_m,
        "memory_method": res["memory_method"],
        "floor_seconds_all": t["floor"], "ours_seconds_all": t["ours"], "time_ratios_all": ratios,
        "floor_peak_mib_all": [x / 2**20 for x in m["floor"]], "ours_peak_mib_all": [x / 2**20 for x in m["ours"]],
    }


# --------------------------------------------------------------------------- main
def render(result: dict) -> None:
    from rich.console import Console

    console = Console()
    if "generation" in result:
        _render_generation(console, result)
    if "train" in result:
        _render_train(console, result["train"])


def _render_generation(console: Any, result: dict) -> None:
    from rich.table import Table

    gen = Table(title=f"Generation ({result['model']}, {result['generation_tokens']} new tokens per request, "
                      f"median of {result['generation_repeats']})")
    for col in ("concurrency", "serial tok/s", "concurrent tok/s", "concurrent / serial", "target"):
        gen.add_column(col, justify="right")
    for row in result["generation"]:
        target = ">= 3.5x" if row["concurrency"] == 8 else ""
        gen.add_row(str(row["concurrency"]), f"{row['serial_tok_s']:.1f}", f"{row['concurrent_tok_s']:.1f}",
                    f"{row['ratio']:.2f}x", target)
    console.print(gen)


def _render_train(console: Any, tr: dict) -> None:
    from rich.table import Table

    train = Table(title=f"Train step ({tr['batch']} x {tr['length']} tokens, median of {tr['steps']} "
                        f"interleaved steps; peak memory: {tr['memory_method']})")
    for col in ("", "floor (plain HF step)", "ours (train_step_sync)", "ours / floor", "target"):
        train.add_column(col, justify="right")
    train.add_row("time (s)", f"{tr['floor_seconds']:.2f}", f"{tr['ours_seconds']:.2f}",
                  f"{tr['time_ratio']:.2f}x", "<= 1.15x")
    train.add_row("peak memory (MiB)", f"{tr['floor_peak_mib']:.0f}", f"{tr['ours_peak_mib']:.0f}",
                  f"{tr['memory_ratio']:.2f}x", "")
    console.print(train)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="smaller run (fewer tokens, steps and repeats)")
    p.add_argument("--gen-tokens", type=int, default=None, help="new tokens per request (default 64; 32 quick)")
    p.add_argument("--repeats", type=int, default=None, help="generation repeats (default 3; 1 quick)")
    p.add_argument("--batch", type=int, default=None, help="train sequences (default 8; 4 quick)")
    p.add_argument("--length", type=int, default=None, help="train sequence length (default 256; 128 quick)")
    p.add_argument("--steps", type=int, default=None, help="timed train steps per side (default 4; 3 quick)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads for both sides (default: torch's choice, one per core); "
                        "1 avoids OpenMP spin-waiting when other processes compete for the cores")
    p.add_argument("--skip-generation", action="store_true")
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--child", choices=["train"], help=argparse.SUPPRESS)
    args = p.parse_args()
    q = args.quick
    args.gen_tokens = args.gen_tokens or (32 if q else 64)
    args.repeats = args.repeats or (1 if q else 3)
    args.batch = args.batch or (4 if q else 8)
    args.length = args.length or (128 if q else 256)
    args.steps = args.steps or (3 if q else 4)

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(child_train(args)))
        return

    result: dict[str, Any] = {
        "model": args.model, "device": args.device, "quick": q,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "platform": platform.platform(), "torch": torch.__version__,
                    "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None},
        "generation_tokens": args.gen_tokens, "generation_repeats": args.repeats,
    }
    if not args.skip_generation:
        from agentjet.engines.hf import HFEngine
        from agentjet.settings import EngineSettings

        engine = HFEngine(args.model, EngineSettings(device=args.device, max_batch_size=8))
        # Benchmark choice: no stop ids at all (not even the model's EOS, which the engine always adds), so
        # every request generates exactly --gen-tokens tokens and early EOS cannot skew tokens/s.
        engine.generator.stop_ids = frozenset()
        result["generation"] = asyncio.run(bench_generation(engine, [1, 4, 8], args.gen_tokens, args.repeats))
        engine._executor.shutdown(wait=True)
        del engine
    if not args.skip_train:
        result["train"] = bench_train(args)
    render(result)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
