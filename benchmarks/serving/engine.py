"""Engine benchmark: generation throughput of the embedded engine against the earlier engine and the libraries'
own fast paths, on the same requests in one run; and the train step against a bare torch floor.

How to run::

    .venv/bin/python benchmarks/serving/engine.py                    # CPU: SmolLM2-135M-Instruct, c1 and c8
    .venv/bin/python benchmarks/serving/engine.py --quick            # a smoke run
    .venv/bin/python benchmarks/serving/engine.py --train            # the train step vs the floor (CPU: 8 x 256)
    .venv/bin/python benchmarks/serving/engine.py --device cuda --model 135m           # random weights, SmolLM2 shapes
    .venv/bin/python benchmarks/serving/engine.py --device cuda --model 1.7b
    .venv/bin/python benchmarks/serving/engine.py --device cuda --model 1.7b --train  # 16 x 1024, checkpointing

It prints one table and writes JSON under ``benchmarks/results/`` (machine, device name, commit).

**Generation.** Every variant serves the same requests: random prompts of ``--prompt-tokens`` tokens and
either a fixed ``--new-tokens`` new tokens or a uniform number in ``--mixed`` (EOS disabled everywhere, so
each request generates exactly its number). ``c`` clients each send their next request when the previous one
returns (closed loop), until the list is done; tok/s = generated tokens / wall time. Variants:

* ``continuous``: this engine (``HFGenerator``, continuous batching; CUDA graphs on CUDA);
* ablations of it, not run by default: ``continuous-compile`` (``compile=True``: the decode step through
  ``torch.compile``; each (concurrency, workload) is run once untimed first, so compilation is not timed) and
  ``continuous-bf16`` (bf16 weights);
* ``static``: the earlier engine (``batching="static"``: the request batcher and ``StaticGenerator``; a batch runs to
  its longest request). The ratio continuous / static is the headline;
* ``hf-generate``: ``model.generate`` on consecutive batches of ``c`` requests (left-padded, static batch, each
  batch generates its longest request's length; only the requested tokens count);
* ``generate-batch``: transformers' continuous batching (``model.generate_batch``, CUDA graphs on CUDA), fixed
  lengths only (it takes one ``max_new_tokens`` for all requests);
* ``static-compile``: one fixed batch of ``c`` requests with ``StaticCache`` and a ``torch.compile``d decode
  step (``mode="reduce-overhead"`` on CUDA), fixed lengths only; compilation is a warm-up run, reported apart.

**Training** (``--train``): the embedded layout's ``train_step`` (PPO-clip on every position but the first, behaviour
logprobs from a scoring pass) against the floor, a bare ``model(ids, labels=ids).loss.backward();
AdamW.step()`` on the same tokens, both in one fresh subprocess, steps interleaved; time ratio (median of
per-pair ratios), peak memory (CUDA: ``max_memory_allocated`` above the start of the step; CPU: peak RSS
increase), train tokens/s and, on CUDA, MFU (6 x parameters x tokens / time / the card's bf16 peak).
``--train-variants default,flat,compile`` measures each learner variant (``learner.flat_masters``,
``learner.compile_logprobs``, ``chunkN``: ``learner.logprob_chunk_tokens``; options joined by ``+``) against the
same floor in the same child, every side's steps interleaved; a variant's warm-up step (its compilation, its
optimizer state) is reported apart. The first variant is the one the JSON's ``ours_*`` fields describe.

The machine may be shared: compare only ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # workloads.py

from agentjet.runtime.blocking import run_blocking  # noqa: E402
from agentjet.runtime.omp import prefer_passive_openmp  # noqa: E402

prefer_passive_openmp()  # before torch loads: the process-wide OpenMP default, as in the server

# isort: split
import torch  # noqa: E402
from workloads import (  # noqa: E402
    MODEL_ROOT,
    RESULTS,
    Req,
    closed_loop,
    machine,
    make_requests,
    model_path,
    parameter_count,
    peak_tflops,
)


# =========================================================================== generation variants
class Variant:
    name = ""
    fixed_only = False  # serves only requests of one length
    one_batch = False  # serves only one batch of ``c`` requests

    async def run(self, reqs: list[Req], concurrency: int) -> tuple[int, float]:
        raise NotImplementedError

    async def close(self) -> None:
        pass


class AgentJet(Variant):
    warm_each = False  # run each (concurrency, workload) once untimed first

    def __init__(self, name: str, path: Path, device: torch.device, dtype: str, slots: int,
                 cache_tokens: int) -> None:
        from agentjet.layouts import embedded_engine
        from agentjet.settings import GeneratorSettings, PlacementSettings

        self.name = name
        self.warm_each = name == "continuous-compile"
        batching = "static" if name == "static" else "continuous"
        if name == "continuous-bf16":
            dtype = "bfloat16"
        self.engine = embedded_engine(path, GeneratorSettings(batching=batching, max_batch_size=slots,
                                                              kv_cache_tokens=cache_tokens,
                                                              compile=name == "continuous-compile"),
                                      placement=PlacementSettings(device=str(device), dtype=dtype))
        self.engine.generator.rules.stop_ids = frozenset()  # no EOS: every request generates exactly its max_tokens

    async def run(self, reqs: list[Req], concurrency: int) -> tuple[int, float]:
        from agentjet.engines.base import SamplingParams

        async def submit(r: Req) -> int:
            res = await self.engine.generate(r.prompt_ids, SamplingParams(temperature=1.0, max_tokens=r.max_tokens,
                                                                          seed=r.seed))
            return len(res.token_ids)

        return await closed_loop(submit, reqs, concurrency)

    async def close(self) -> None:
        await self.engine.close()


def _load(path: Path, device: torch.device, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class HFGenerate(Variant):
    name = "hf-generate"

    def __init__(self, path: Path, device: torch.device, dtype: torch.dtype) -> None:
        self.device = device
        self.model = _load(path, device, dtype)
        self.pad = self.model.generation_config.pad_token_id or 0

    async def run(self, reqs: list[Req], concurrency: int) -> tuple[int, float]:
        from transformers import GenerationConfig

        t0 = time.perf_counter()
        total = 0
        for i in range(0, len(reqs), concurrency):
            batch = reqs[i:i + concurrency]
            width = max(len(r.prompt_ids) for r in batch)
            ids = torch.full((len(batch), width), self.pad, dtype=torch.long)
            attn = torch.zeros_like(ids)
            for j, r in enumerate(batch):
                ids[j, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
                attn[j, width - len(r.prompt_ids):] = 1
            longest = max(r.max_tokens for r in batch)
            cfg = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=longest,
                                   min_new_tokens=longest, pad_token_id=self.pad, eos_token_id=None)
            with torch.inference_mode():
                out = self.model.generate(input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                                          generation_config=cfg)
            _sync(self.device)
            assert out.shape[1] - width == longest
            total += sum(r.max_tokens for r in batch)  # the rest of a short row's tokens are wasted
            await asyncio.sleep(0)
        return total, time.perf_counter() - t0


class GenerateBatch(Variant):
    name = "generate-batch"
    fixed_only = True

    def __init__(self, path: Path, device: torch.device, dtype: torch.dtype) -> None:
        self.device = device
        self.model = _load(path, device, dtype)
        self.pad = self.model.generation_config.pad_token_id or 0

    async def run(self, reqs: list[Req], concurrency: int) -> tuple[int, float]:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        k = reqs[0].max_tokens
        cfg = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=k,
                               min_new_tokens=k, pad_token_id=self.pad, eos_token_id=None)
        cb = ContinuousBatchingConfig(max_requests_per_batch=concurrency,
                                      use_cuda_graph=self.device.type == "cuda")
        t0 = time.perf_counter()
        out = self.model.generate_batch(inputs=[r.prompt_ids for r in reqs], generation_config=cfg,
                                        continuous_batching_config=cb, progress_bar=False)
        _sync(self.device)
        return sum(len(o.generated_tokens) for o in out.values()), time.perf_counter() - t0


class StaticCompile(Variant):
    name = "static-compile"
    fixed_only = True
    one_batch = True

    def __init__(self, path: Path, device: torch.device, dtype: torch.dtype) -> None:
        self.device = device
        self.model = _load(path, device, dtype)
        self.compile_s: dict[int, float] = {}
        self._steps: dict[int, Any] = {}

    def _generate(self, batch: list[Req]) -> int:
        from transformers import StaticCache

        k, width = batch[0].max_tokens, len(batch[0].prompt_ids)
        cache = StaticCache(config=self.model.config, max_cache_len=width + k)
        ids = torch.tensor([r.prompt_ids for r in batch], device=self.device)  # equal lengths: no padding
        step = self._steps.get(len(batch))
        if step is None:
            mode = "reduce-overhead" if self.device.type == "cuda" else None
            step = torch.compile(self._decode, mode=mode, dynamic=False)
            self._steps[len(batch)] = step
        with torch.inference_mode():
            logits = self.model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]
            g = torch.Generator(device=self.device).manual_seed(batch[0].seed)
            for i in range(k):
                tokens = torch.multinomial(logits.float().softmax(-1), 1, generator=g)
                if i + 1 < k:
                    logits = step(tokens, cache).clone()
        _sync(self.device)
        return len(batch) * k

    def _decode(self, tokens: torch.Tensor, cache: Any) -> torch.Tensor:
        return self.model(input_ids=tokens, past_key_values=cache, use_cache=True).logits[:, -1]

    async def run(self, reqs: list[Req], concurrency: int) -> tuple[int, float]:
        batch = reqs[:concurrency]
        if concurrency not in self.compile_s:
            t0 = time.perf_counter()
            self._generate(batch)  # compiles (and, on CUDA, records the graphs)
            self.compile_s[concurrency] = time.perf_counter() - t0
        t0 = time.perf_counter()
        tokens = self._generate(batch)
        return tokens, time.perf_counter() - t0


def build_variants(names: list[str], path: Path, device: torch.device, dtype: str, slots: int,
                   cache_tokens: int) -> list[Variant]:
    torch_dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32, "float32": torch.float32,
                   "bfloat16": torch.bfloat16}[dtype]
    out: list[Variant] = []
    for name in names:
        if name in ("continuous", "static", "continuous-compile", "continuous-bf16"):
            out.append(AgentJet(name, path, device, dtype, slots, cache_tokens))
        elif name == "hf-generate":
            out.append(HFGenerate(path, device, torch_dtype))
        elif name == "generate-batch":
            out.append(GenerateBatch(path, device, torch_dtype))
        elif name == "static-compile":
            out.append(StaticCompile(path, device, torch_dtype))
        else:
            raise SystemExit(f"unknown variant {name!r}")
    return out


async def bench_generation(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from transformers import AutoTokenizer

    path = model_path(args.model, torch.bfloat16 if device.type == "cuda" else torch.float32, MODEL_ROOT)
    tok = AutoTokenizer.from_pretrained(path)
    special = set(tok.all_special_ids)
    slots = max(args.concurrency)
    longest = args.prompt_tokens + max(args.new_tokens, args.mixed[1])
    variants = build_variants(args.variants, path, device, args.dtype, slots, longest)
    workloads = {k: v for k, v in {"fixed": args.new_tokens, "mixed": tuple(args.mixed)}.items()
                 if k in args.workloads}
    rows: list[dict[str, Any]] = []
    try:
        # warm-up: every variant serves a few short requests once (lazy initialisation, first graphs)
        warm = make_requests(len(tok), special, 2, args.prompt_tokens, 8, seed=999)
        for v in variants:
            if not (v.fixed_only and v.one_batch):
                await v.run(warm, 2)
        for c in args.concurrency:
            # each variant first serves c requests at concurrency c at the longest timed length, untimed: a batch
            # of a new size, or attending to a new width, captures its CUDA graphs (and new shapes pick their
            # kernels) on first use, which a running server pays once, not per request
            warm_c = make_requests(len(tok), special, c, args.prompt_tokens, max(map(_longest, workloads.values())),
                                   seed=998)
            for v in variants:
                if not (v.fixed_only and v.one_batch):
                    await v.run(warm_c, c)
            for wname, new in workloads.items():
                reqs = make_requests(len(tok), special, c * args.requests_per_client(c, wname), args.prompt_tokens,
                                     new, seed=c * 10 + (wname == "mixed"))
                for rep in range(args.repeats):
                    order = variants if rep % 2 == 0 else list(reversed(variants))
                    for v in order:
                        if v.fixed_only and wname != "fixed":
                            continue
                        try:
                            if getattr(v, "warm_each", False) and rep == 0:
                                await v.run(reqs, c)  # compiles this shape set; not timed
                            tokens, secs = await v.run(reqs, c)
                        except Exception as exc:  # noqa: BLE001 - a library path that does not run here
                            print(f"  {v.name} c={c} {wname}: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                            rows.append({"variant": v.name, "workload": wname, "concurrency": c, "repeat": rep,
                                         "error": f"{type(exc).__name__}: {exc}"[:500]})
                            continue
                        row = {"variant": v.name, "workload": wname, "concurrency": c, "repeat": rep,
                               "requests": c if v.one_batch else len(reqs), "tokens": tokens, "seconds": secs,
                               "tok_s": tokens / secs}
                        if isinstance(v, StaticCompile):
                            row["compile_seconds"] = v.compile_s.get(c)
                        rows.append(row)
                        print(f"  {v.name:15s} c={c:<4d} {wname:5s} {tokens:6d} tokens {secs:7.2f} s "
                              f"{tokens / secs:9.1f} tok/s", file=sys.stderr, flush=True)
        prefill = None
        if args.profile:
            first = next((v for v in variants if isinstance(v, AgentJet)), None)
            if first is not None:
                prompts = [r.prompt_ids for r in make_requests(len(tok), special, slots, args.prompt_tokens, 1,
                                                               seed=997)]
                prefill = profile_prefill(first.engine, prompts, device)
        stats = {}
        for v in variants:
            if isinstance(v, AgentJet):
                stats[v.name] = {k: val for k, val in v.engine.generator.stats.items() if isinstance(val, int | float)}
                stats[v.name]["describe"] = v.engine.describe()
    finally:
        for v in variants:
            await v.close()
    return {"model": args.model, "model_path": str(path), "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens, "mixed": list(args.mixed), "concurrency": args.concurrency,
            "repeats": args.repeats, "rows": rows, "summary": summarize(rows), "engine_stats": stats,
            "prefill_profile": prefill}


def profile_prefill(engine: Any, prompts: list[list[int]], device: torch.device) -> dict[str, Any]:
    """One admission of ``prompts`` into an idle engine (``SlotRunner.prefill`` and the first token's sampling,
    what the scheduler runs for a batch of joiners), on the engine's own thread: its wall time (median of 5 after
    2 warm-ups), then one more under torch.profiler. The ops' own CPU time against the wall time says how much of
    an admission is Python between the ops (the model's layers, the cache's bookkeeping) rather than the ops."""
    from agentjet.engines.base import SamplingParams
    from agentjet.engines.sampling import sample_next

    gen = engine.generator
    slots = list(range(len(prompts)))
    params = [SamplingParams(temperature=1.0, max_tokens=1, seed=i) for i in slots]

    def admit() -> None:
        logits = gen.core.runner.prefill(slots, prompts)
        tokens, _, _ = sample_next(logits, params, [torch.Generator().manual_seed(i) for i in slots], 0)
        tokens.tolist()
        gen.core.runner.release(slots)
        gen.core.runner.restart()

    def job() -> dict[str, Any]:
        walls = []
        for i in range(7):
            _sync(device)
            start = time.perf_counter()
            admit()
            _sync(device)
            if i >= 2:
                walls.append(time.perf_counter() - start)
        totals: dict[str, float] = {}
        top = _profile(admit, device, rows=25, totals=totals)
        return {"rows": len(prompts), "prompt_tokens": len(prompts[0]), "wall_ms": statistics.median(walls) * 1e3,
                "walls_ms": [w * 1e3 for w in walls], **totals, "top_ops": top}

    out = gen.worker.submit(job).result()
    print(f"  prefill of {out['rows']} x {out['prompt_tokens']} tokens: {out['wall_ms']:.1f} ms; under the "
          f"profiler the ops' own CPU time {out['self_cpu_ms']:.1f} ms, device time {out['self_device_ms']:.1f} ms, "
          f"{out['op_calls']} op calls", file=sys.stderr)
    return out


def _longest(new: int | tuple[int, int]) -> int:
    """A workload's longest reply: ``fixed`` is one length, ``mixed`` a (shortest, longest) range."""
    return max(new) if isinstance(new, tuple) else new


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median tok/s per (variant, workload, c), and ratios against the static engine on the same requests."""
    med: dict[str, dict[str, float]] = {}
    for r in rows:
        if "tok_s" in r:
            med.setdefault(f"{r['workload']}/c{r['concurrency']}", {}).setdefault(r["variant"], []).append(r["tok_s"])
    out: dict[str, Any] = {}
    for key, per in med.items():
        tok_s = {v: statistics.median(xs) for v, xs in per.items()}
        entry: dict[str, Any] = {"tok_s": tok_s}
        if "static" in tok_s and "continuous" in tok_s:
            entry["continuous_over_static"] = tok_s["continuous"] / tok_s["static"]
        out[key] = entry
    for c in {r["concurrency"] for r in rows}:
        fixed, mixed = out.get(f"fixed/c{c}", {}), out.get(f"mixed/c{c}", {})
        if "continuous_over_static" in fixed and "continuous_over_static" in mixed:
            mixed["mixed_gain_over_fixed"] = mixed["continuous_over_static"] / fixed["continuous_over_static"]
    return out


# =========================================================================== training (in a child process)
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


def _floor_step(path: Path, device: torch.device, dtype: torch.dtype, ids: torch.Tensor, checkpointing: bool):
    """The floor: a bare Hugging Face causal-LM step with AdamW, nothing else."""
    model = _load(path, device, dtype)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.999), weight_decay=0.0)
    ids = ids.to(device)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    return step


# ``--train-variants``: the learner options the train step is measured with, each against the floor in the same
# run. A variant is ``default`` or options joined by ``+``: ``flat`` (learner.flat_masters), ``compile``
# (learner.compile_logprobs), ``chunkN`` (learner.logprob_chunk_tokens = N).
TRAIN_OPTIONS = {"flat": ("flat_masters", True), "compile": ("compile_logprobs", True)}


def variant_settings(name: str, logprob_chunk_tokens: int) -> dict[str, Any]:
    """The learner settings of a ``--train-variants`` entry (see ``TRAIN_OPTIONS``)."""
    out: dict[str, Any] = {"logprob_chunk_tokens": logprob_chunk_tokens}
    for part in name.split("+"):
        if part == "default":
            continue
        if part in TRAIN_OPTIONS:
            key, value = TRAIN_OPTIONS[part]
            out[key] = value
        elif part.startswith("chunk") and part[5:].isdigit():
            out["logprob_chunk_tokens"] = int(part[5:])
        else:
            raise SystemExit(f"unknown train variant part {part!r} in {name!r} (default, {', '.join(TRAIN_OPTIONS)}, "
                             "chunkN)")
    return out


def _engine_step(path: Path, device: torch.device, dtype: str, ids: torch.Tensor, seed: int, checkpointing: bool,
                 learner: dict[str, Any]):
    """Ours: the embedded layout's ``train_step`` on the same tokens, every position but the first trained, with
    the ``learner`` settings; and the micro-batch (padded tokens) its learner chose."""
    from agentjet.engines.base import TrainSample
    from agentjet.layouts import embedded_engine
    from agentjet.settings import GeneratorSettings, LearnerSettings, PlacementSettings

    # the micro-batch is the learner's own choice (unset: 4,096 tokens on CPU, from free memory on CUDA)
    engine = embedded_engine(path, GeneratorSettings(max_batch_size=1, kv_cache_tokens=16),
                             LearnerSettings(gradient_checkpointing=checkpointing, **learner),
                             placement=PlacementSettings(device=str(device), dtype=dtype))
    g = torch.Generator().manual_seed(seed + 1)
    samples = []
    for row in ids.tolist():
        adv = (torch.randn(1, generator=g) + 0.1 * torch.randn(len(row), generator=g)).tolist()
        samples.append(TrainSample(row, [0] + [1] * (len(row) - 1), [0.0] * len(row), adv))
    # behaviour logprobs = the current policy's (a no-grad scoring pass), as right after a rollout
    for s, lps in zip(samples, run_blocking(engine.learner.score(samples)), strict=True):
        s.behaviour_logprobs = [0.0] + lps

    def step() -> None:
        run_blocking(engine.train_step(samples))

    def profiled() -> list[dict[str, Any]]:
        # the profiler records the ops of its own thread: enter it on the learner's worker thread, around the
        # learner's step there (what train_step runs on that thread)
        learner = engine.learner
        return learner.worker.submit(_profile, lambda: learner._train(samples), device).result()

    return step, engine.learner.micro_batch_tokens, profiled


def _profile(step: Any, device: torch.device, rows: int = 20,
             totals: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """One more step under torch.profiler: the ops that took the most device (CUDA) or CPU time, with their
    call counts; the table goes to stderr. ``totals``, if given, gets the sums over every op: the ops' own CPU
    time, device time and calls."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    key = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    with profile(activities=activities) as prof:
        step()
        _sync(device)
    averages = prof.key_averages()
    try:
        print(averages.table(sort_by=key, row_limit=rows), file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001 - the table is a convenience; the JSON rows below are the record
        print(f"  (no profile table: {exc!r})", file=sys.stderr)
    if totals is not None:
        totals.update(self_cpu_ms=sum(e.self_cpu_time_total for e in averages) / 1e3,
                      self_device_ms=sum(getattr(e, "self_device_time_total", 0.0) for e in averages) / 1e3,
                      op_calls=sum(e.count for e in averages))
    top = sorted(averages, key=lambda e: getattr(e, key, 0.0), reverse=True)[:rows]
    return [{"op": e.key, "calls": e.count, "cpu_ms": e.cpu_time_total / 1e3,
             "device_ms": getattr(e, "device_time_total", 0.0) / 1e3} for e in top]


def child_train(args: argparse.Namespace) -> dict:
    """The floor and every variant of ours, in one fresh process, their steps interleaved (the order turns
    every step, so a slow phase of the machine hits each side)."""
    from transformers import AutoConfig

    device = torch.device(args.device)
    dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32, "float32": torch.float32,
             "bfloat16": torch.bfloat16}[args.dtype]
    path = model_path(args.model, dtype, MODEL_ROOT)
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, AutoConfig.from_pretrained(path).vocab_size, (args.batch, args.length), generator=g)
    steps: dict[str, Any] = {"floor": _floor_step(path, device, dtype, ids, args.checkpointing)}
    micro: dict[str, int] = {}
    profiled: dict[str, Any] = {}
    for name in args.train_variants:
        steps[name], micro[name], profiled[name] = _engine_step(
            path, device, args.dtype, ids, args.seed, args.checkpointing, variant_settings(name, args.logprob_chunk))
    sides = list(steps)
    times: dict[str, list[float]] = {k: [] for k in sides}
    peaks: dict[str, list[int]] = {k: [] for k in sides}
    warmup: dict[str, float] = {}
    method = ""
    for i in range(args.steps + 1):
        # the order turns each step; step 0 of each side is its warm-up (the optimizer's state, a compilation)
        order = sides[i % len(sides):] + sides[:i % len(sides)]
        for side in order if i % 2 == 0 else list(reversed(order)):
            _sync(device)
            with PeakMemory(device) as mem:
                t0 = time.perf_counter()
                steps[side]()
                _sync(device)
                elapsed = time.perf_counter() - t0
            method = mem.method
            if i > 0:
                times[side].append(elapsed)
                peaks[side].append(mem.peak_bytes)
            else:
                warmup[side] = elapsed
            print(f"  train {side}: step {i}{' (warm-up)' if i == 0 else ''} {elapsed:.2f}s "
                  f"peak +{mem.peak_bytes / 2**20:.0f} MiB", file=sys.stderr, flush=True)
    first = args.train_variants[0]
    profiles = {"floor": _profile(steps["floor"], device), "ours": profiled[first]()} if args.profile else None
    return {"times": times, "peaks": peaks, "warmup_seconds": warmup, "memory_method": method,
            "parameters": parameter_count(path), "profiles": profiles, "micro_batch_tokens": micro,
            "machine": machine(device)}


def bench_train(args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", "train", "--model", args.model, "--device", args.device,
           "--dtype", args.dtype, "--batch", str(args.batch), "--length", str(args.length), "--steps",
           str(args.steps), "--seed", str(args.seed), "--logprob-chunk", str(args.logprob_chunk),
           "--train-variants", ",".join(args.train_variants)] + (
           ["--checkpointing"] if args.checkpointing else []) + (["--profile"] if args.profile else []) + (
           ["--threads", str(args.threads)] if args.threads else [])
    env = dict(os.environ)
    # A fixed mmap threshold (which also turns off glibc's dynamic one): large tensors are mmapped and given
    # back to the OS when freed, so each step's peak RSS is measured from a clean baseline instead of being
    # hidden by memory that malloc kept from the previous step. Same for both sides.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    env.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 20))
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    t, m = res["times"], res["peaks"]
    tokens = args.batch * args.length
    flops = 6 * res["parameters"] * tokens
    peak = peak_tflops(torch.device(args.device))
    floor_s, floor_m = statistics.median(t["floor"]), statistics.median(m["floor"])

    def against_floor(side: str) -> dict[str, Any]:
        ratios = [o / f for o, f in zip(t[side], t["floor"], strict=True)]
        secs, mem = statistics.median(t[side]), statistics.median(m[side])
        return {"seconds": secs, "time_ratio": statistics.median(ratios), "tokens_per_s": tokens / secs,
                "mfu": flops / secs / (peak * 1e12) if peak else None, "peak_mib": mem / 2**20,
                "memory_ratio": mem / floor_m if floor_m else None, "seconds_all": t[side], "time_ratios_all": ratios,
                "peak_mib_all": [x / 2**20 for x in m[side]], "warmup_seconds": res["warmup_seconds"][side],
                "micro_batch_tokens": res["micro_batch_tokens"].get(side),
                "learner": variant_settings(side, args.logprob_chunk) if side != "floor" else None}

    variants = {v: against_floor(v) for v in args.train_variants}
    ours = variants[args.train_variants[0]]
    return {
        "batch": args.batch, "length": args.length, "steps": args.steps, "checkpointing": args.checkpointing,
        "parameters": res["parameters"], "micro_batch_tokens": ours["micro_batch_tokens"],
        # "ours": the first variant (``default`` unless --train-variants says otherwise)
        "ours_variant": args.train_variants[0],
        "floor_seconds": floor_s, "ours_seconds": ours["seconds"], "time_ratio": ours["time_ratio"],
        "floor_tokens_per_s": tokens / floor_s, "ours_tokens_per_s": ours["tokens_per_s"],
        "floor_mfu": flops / floor_s / (peak * 1e12) if peak else None, "ours_mfu": ours["mfu"],
        "floor_peak_mib": floor_m / 2**20, "ours_peak_mib": ours["peak_mib"], "memory_ratio": ours["memory_ratio"],
        "memory_method": res["memory_method"],
        "floor_seconds_all": t["floor"], "ours_seconds_all": ours["seconds_all"], "time_ratios_all": ours["time_ratios_all"],
        "floor_peak_mib_all": [x / 2**20 for x in m["floor"]], "ours_peak_mib_all": ours["peak_mib_all"],
        "floor_warmup_seconds": res["warmup_seconds"]["floor"], "variants": variants,
        "child_machine": res["machine"], "logprob_chunk_tokens": args.logprob_chunk, "profiles": res["profiles"],
    }


# =========================================================================== output
def render(result: dict) -> None:
    from rich.console import Console

    console = Console(width=160)  # a log is no terminal: a narrow default would wrap the columns
    if "generation" in result:
        _render_generation(console, result)
    if "train" in result:
        _render_train(console, result["train"])


def _render_generation(console: Any, result: dict) -> None:
    from rich.table import Table

    gen = result["generation"]
    keys = [f"{w}/c{c}" for c in gen["concurrency"] for w in ("fixed", "mixed")]
    keys = [k for k in keys if k in gen["summary"]]
    variants = list(dict.fromkeys(r["variant"] for r in gen["rows"]))
    lo, hi = gen["mixed"]
    m = result["machine"]
    table = Table(title=f"Generation tok/s: {gen['model']} on {m['device_name']} ({m['device']}), prompt "
                        f"{gen['prompt_tokens']} tokens; fixed = {gen['new_tokens']} new tokens, mixed = uniform "
                        f"{lo}-{hi}; median of {gen['repeats']}")
    table.add_column("variant")
    for k in keys:
        table.add_column(k, justify="right")
    for v in variants:
        cells = []
        for k in keys:
            x = gen["summary"][k]["tok_s"].get(v)
            cells.append(f"{x:.1f}" if x is not None else "-")
        table.add_row(v, *cells)
    table.add_row("continuous / static", *[
        f"{gen['summary'][k]['continuous_over_static']:.2f}x" if "continuous_over_static" in gen["summary"][k]
        else "-" for k in keys])
    table.add_row("mixed gain over fixed", *[
        f"{gen['summary'][k]['mixed_gain_over_fixed']:.2f}x" if "mixed_gain_over_fixed" in gen["summary"][k]
        else "" for k in keys])
    console.print(table)
    compile_s = {r["concurrency"]: r["compile_seconds"] for r in gen["rows"] if r.get("compile_seconds")}
    if compile_s:
        console.print("static-compile warm-up (compilation) seconds: " +
                      ", ".join(f"c{c}: {s:.0f}" for c, s in sorted(compile_s.items())))
    errors = {(r["variant"], r["error"]) for r in gen["rows"] if "error" in r}
    for v, e in sorted(errors):
        console.print(f"[yellow]{v} did not run: {e}[/yellow]")


def _render_train(console: Any, tr: dict) -> None:
    from rich.table import Table

    table = Table(title=f"Train step ({tr['batch']} x {tr['length']} tokens, {tr['parameters'] / 1e6:.0f}M "
                        f"parameters{', gradient checkpointing' if tr['checkpointing'] else ''}; median of "
                        f"{tr['steps']} interleaved steps; peak memory: {tr['memory_method']}); target <= 1.15x the "
                        "floor's time at <= 1x its memory")
    for col in ("", "time (s)", "/ floor", "train tokens/s", "MFU", "peak memory (MiB)", "/ floor", "micro-batch",
                "warm-up (s)"):
        table.add_column(col, justify="right")
    table.add_row("floor (bare torch step)", f"{tr['floor_seconds']:.3f}", "", f"{tr['floor_tokens_per_s']:.0f}",
                  f"{100 * tr['floor_mfu']:.1f}%" if tr["floor_mfu"] is not None else "-", f"{tr['floor_peak_mib']:.0f}",
                  "", "", f"{tr['floor_warmup_seconds']:.1f}")
    for name, v in tr["variants"].items():
        table.add_row(f"ours: {name}", f"{v['seconds']:.3f}", f"{v['time_ratio']:.2f}x", f"{v['tokens_per_s']:.0f}",
                      f"{100 * v['mfu']:.1f}%" if v["mfu"] is not None else "-", f"{v['peak_mib']:.0f}",
                      f"{v['memory_ratio']:.2f}x" if v["memory_ratio"] is not None else "-",
                      str(v["micro_batch_tokens"]), f"{v['warmup_seconds']:.1f}")
    console.print(table)


# =========================================================================== main
def parse_args() -> argparse.Namespace:
    from agentjet.settings import LearnerSettings

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="smollm2-135m-instruct (CPU default), 135m or 1.7b (random "
                   "weights with SmolLM2 shapes; the CUDA default is 135m), or a local HF directory")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--quick", action="store_true", help="a smoke run (fewer, shorter requests)")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="comma-separated (default: 1,8 on CPU; 1,8,64,256 on CUDA)")
    p.add_argument("--variants", type=lambda s: s.split(","), default=None,
                   help="comma-separated, from continuous,static,hf-generate,generate-batch,static-compile and "
                   "the ablations continuous-compile,continuous-bf16")
    p.add_argument("--workloads", type=lambda s: s.split(","), default=["fixed", "mixed"],
                   help="fixed, mixed or both (default)")
    p.add_argument("--prompt-tokens", type=int, default=None, help="prompt length (default 64 on CPU, 100 on CUDA)")
    p.add_argument("--new-tokens", type=int, default=None, help="fixed new tokens (default 128)")
    p.add_argument("--mixed", type=lambda s: [int(x) for x in s.split("-")], default=None,
                   help="mixed new tokens lo-hi (default 16-512 on CUDA, 16-256 on CPU)")
    p.add_argument("--requests", type=int, default=None, help="requests per client (default: fixed 2, mixed 4; "
                   "half that at c >= 64)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--train", action="store_true", help="the train step against the floor (instead of generation)")
    p.add_argument("--batch", type=int, default=None, help="train sequences (default 8 on CPU, 16 on CUDA)")
    p.add_argument("--length", type=int, default=None, help="train sequence length (default 256 on CPU, 1024 on "
                   "CUDA)")
    p.add_argument("--steps", type=int, default=None, help="timed train steps per side (default 4)")
    p.add_argument("--checkpointing", action="store_true", default=None,
                   help="gradient checkpointing on both sides (default: on for 1.7b)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--logprob-chunk", type=int, default=LearnerSettings().logprob_chunk_tokens,
                   help="--train: the learner's logprob_chunk_tokens (default: the setting's)")
    p.add_argument("--train-variants", type=lambda x: x.split(","), default=["default"],
                   help="--train: the learner variants to measure against the floor in the same run, comma-separated: "
                   "default, or options joined by + (flat: learner.flat_masters; compile: learner.compile_logprobs; "
                   "chunkN: learner.logprob_chunk_tokens N), e.g. default,flat,compile,flat+compile")
    p.add_argument("--profile", action="store_true", help="--train: one more step of each side under "
                   "torch.profiler (the top ops go to stderr and the JSON); generation: one admission of the largest "
                   "concurrency's prompts, timed and profiled on the engine's thread")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: one per core)")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--child", choices=["train"], help=argparse.SUPPRESS)
    args = p.parse_args()
    cuda = args.device.startswith("cuda")
    q = args.quick
    args.model = args.model or ("135m" if cuda else "smollm2-135m-instruct")
    args.concurrency = args.concurrency or ([1, 8, 64, 256] if cuda else [1, 8])
    args.variants = args.variants or ["continuous", "static", "hf-generate", "generate-batch", "static-compile"]
    args.prompt_tokens = args.prompt_tokens or (100 if cuda else 64)
    args.new_tokens = args.new_tokens or (32 if q else 128)
    args.mixed = args.mixed or ([8, 64] if q else [16, 512] if cuda else [16, 256])
    per = args.requests

    def requests_per_client(c: int, workload: str) -> int:
        """Mixed lengths need more requests than slots: the gain of slot refill is what the freed slots serve."""
        base = per or (1 if q or c >= 64 else 2)
        return base * 2 if workload == "mixed" and not per else base

    args.requests_per_client = requests_per_client
    args.batch = args.batch or (4 if q else 16 if cuda else 8)
    args.length = args.length or (128 if q else 1024 if cuda else 256)
    args.steps = args.steps or (2 if q else 4)
    if args.checkpointing is None:
        args.checkpointing = args.model == "1.7b"
    return args


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(child_train(args)))
        return
    device = torch.device(args.device)
    result: dict[str, Any] = {"machine": machine(device), "args": {k: v for k, v in vars(args).items()
                                                                   if k != "requests_per_client"}}
    if args.train:
        result["train"] = bench_train(args)
    else:
        result["generation"] = asyncio.run(bench_generation(args, device))
    render(result)
    name = f"engine_{'train_' if args.train else ''}{device.type}_{args.model.replace('/', '_').replace('.', '')}"
    out = args.output or RESULTS / f"{name}{'_quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
