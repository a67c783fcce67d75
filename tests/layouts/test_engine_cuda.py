"""The embedded engine on CUDA: device and dtype defaults, CUDA graphs that agree with the eager step and stay
valid across in-place train steps, exact behaviour logprobs (fp32) and bounded ones (bf16), LoRA and full
fine-tuning on the GPU. Skipped without a CUDA device (the ``cuda`` marker); the graph control flow and
``compile=True`` are also tested on CPU (tests/generators/test_continuous.py)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import torch
from tests.generators.test_continuous import teacher_forced

from agentjet.engines.base import SamplingParams, TrainSample
from agentjet.layouts import embedded_engine
from agentjet.layouts.composed import ComposedEngine
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import LoraSettings


def engine_of(model, *, device: str = "auto", dtype: str = "auto", lora=None, autocast_bf16: bool = False,
              loss=None, learning_rate: float = 1e-5, flat_masters: bool = False, compile_logprobs: bool = False,
              **generator):  # noqa: ANN001, ANN201
    """The single-process engine with these settings, each given to its section."""
    from agentjet.settings import GeneratorSettings, LearnerSettings, LoraSettings, PlacementSettings

    return embedded_engine(model, GeneratorSettings(**generator),
                           LearnerSettings(lora=lora or LoraSettings(), autocast_bf16=autocast_bf16,
                                           learning_rate=learning_rate, flat_masters=flat_masters,
                                           compile_logprobs=compile_logprobs),
                           loss, PlacementSettings(device=device, dtype=dtype))

pytestmark = pytest.mark.cuda  # every test here: skipped without a CUDA device (tests/conftest.py)


def run_all(engine: ComposedEngine, prompts: list[list[int]], params: list[SamplingParams]) -> list:
    async def main() -> list:
        return await asyncio.wait_for(asyncio.gather(*(engine.generate(p, s) for p, s in
                                                       zip(prompts, params, strict=True))), 300)

    return asyncio.run(main())


def report(name: str, value: dict) -> None:
    """Measured figures go to $AGENTJET_CUDA_REPORT (a JSON lines file) when set, and to the test output."""
    print(f"{name}: {value}")
    path = os.environ.get("AGENTJET_CUDA_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": name, **value}) + "\n")


def workload(engine: ComposedEngine, chat_ids, n: int = 6) -> tuple[list[list[int]], list[SamplingParams]]:
    """``n`` chat prompts and fixed-length sampling parameters (the engine's EOS is turned off)."""
    engine.generator.rules.stop_ids = frozenset()
    questions = ["a", "what is 12 + 30?", "write hello in capitals", "sort 3 1 2", "yes", "tell me a story"]
    prompts = [chat_ids(questions[i % len(questions)], engine) for i in range(n)]
    params = [SamplingParams(temperature=1.0, max_tokens=8 + 5 * i, seed=i, stop_token_ids=()) for i in range(n)]
    return prompts, params


def test_auto_device_is_cuda_and_dtype_bf16(tiny_model_path: Path) -> None:
    engine = engine_of(tiny_model_path)
    try:
        info = engine.describe()
        assert info["device"].startswith("cuda") and info["dtype"] == "bfloat16"
        assert info["cuda_graphs"] is True and info["batching"] == "continuous"
        assert next(engine.generator.model.parameters()).is_cuda
    finally:
        run_blocking(engine.close())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graphs_agree_with_the_eager_step(tiny_model_path: Path, chat_ids, dtype: str) -> None:
    graphs = engine_of(tiny_model_path, device="cuda", dtype=dtype, max_batch_size=8)
    eager = engine_of(tiny_model_path, device="cuda", dtype=dtype, max_batch_size=8, cuda_graphs=False)
    try:
        eager.generator.rules.stop_ids = frozenset()
        prompts, params = workload(graphs, chat_ids)
        a, b = run_all(graphs, prompts, params), run_all(eager, prompts, params)
        assert graphs.generator.stats["graph_replays"] > 0 and graphs.generator.stats["graph_failures"] == 0
        assert graphs.generator.stats["static_prefills"] > 0  # prefills replayed from graphs too
        assert eager.generator.stats["graph_replays"] == 0 and eager.generator.stats["static_prefills"] == 0
        diffs = [abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra.logprobs, rb.logprobs, strict=True)]
        same = sum(ra.token_ids == rb.token_ids for ra, rb in zip(a, b, strict=True))
        report(f"graphs_vs_eager_{dtype}", {"max_abs_logprob_diff": max(diffs), "same_tokens": f"{same}/{len(a)}",
                                            "static_prefills": graphs.generator.stats["static_prefills"]})
        assert max(diffs) < (1e-4 if dtype == "float32" else 5e-2)
        if dtype == "float32":
            assert same == len(a)
    finally:
        run_blocking(graphs.close())
        run_blocking(eager.close())


def test_fp32_behaviour_logprobs_are_exact_on_cuda(tiny_model_path: Path, chat_ids) -> None:
    engine = engine_of(tiny_model_path, device="cuda", dtype="float32", max_batch_size=4)
    try:
        prompts, params = workload(engine, chat_ids)
        worst = 0.0
        for p, s, r in zip(prompts, params, run_all(engine, prompts, params), strict=True):
            ref = teacher_forced(engine, p, r.token_ids, s.temperature)
            worst = max(worst, max(abs(a - b) for a, b in zip(r.logprobs, ref, strict=True)))
        report("fp32_vs_teacher_forcing", {"max_abs_logprob_diff": worst})
        assert worst < 1e-4
    finally:
        run_blocking(engine.close())


def _trained_or_tiny(tiny_model_path: Path) -> tuple[str, Path]:
    """SmolLM2-135M-Instruct where its package is installed (trained weights: realistic distributions), else the
    tiny random model."""
    from agentjet.models import resolve_model

    try:
        return "smollm2-135m-instruct", resolve_model("smollm2-135m-instruct")
    except Exception:  # noqa: BLE001 - e.g. a GPU machine without the SmolLM2 package
        return "tiny-random", tiny_model_path


def test_bf16_behaviour_logprobs_against_teacher_forcing(tiny_model_path: Path) -> None:
    """bf16 with graphs: the recorded logprobs against one teacher-forced pass of the same weights. bf16 rounds
    differently in a batched decode step and in a full forward, so the difference is reported and bounded."""
    name, path = _trained_or_tiny(tiny_model_path)
    engine = engine_of(path, device="cuda", dtype="bfloat16", max_batch_size=16)
    try:
        tok = engine.tokenizer
        texts = ["Write a story about a lighthouse.", "Explain how a refrigerator works.", "What is 17 * 23?",
                 "List five fruits.", "Describe the ocean at night.", "Why is the sky blue?"]
        prompts = [list(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)) for t in texts]
        params = [SamplingParams(temperature=1.0, max_tokens=64, seed=i) for i in range(len(prompts))]
        diffs: list[float] = []
        for p, s, r in zip(prompts, params, run_all(engine, prompts, params), strict=True):
            ref = teacher_forced(engine, p, r.token_ids, s.temperature)
            diffs += [abs(a - b) for a, b in zip(r.logprobs, ref, strict=True)]
        mean = sum(diffs) / len(diffs)
        report("bf16_vs_teacher_forcing", {"model": name, "tokens": len(diffs), "mean_abs_logprob_diff": mean,
                                           "max_abs_logprob_diff": max(diffs)})
        assert mean < 0.05
    finally:
        run_blocking(engine.close())


@pytest.mark.parametrize("lora", [False, True])
def test_generate_train_generate_keeps_graphs_valid(tiny_model_path: Path, chat_ids, tmp_path: Path,
                                                    lora: bool) -> None:
    """Train steps update the weights in place: the captured graphs read the new weights with no recapture, and
    what the engine generates next equals what a fresh engine holding the trained weights generates."""
    settings = {"device": "cuda", "dtype": "float32", "max_batch_size": 4,
                "lora": LoraSettings(rank=4, alpha=8) if lora else LoraSettings()}
    engine = engine_of(tiny_model_path, **settings)
    fresh = engine_of(tiny_model_path, **settings)
    fresh.generator.rules.stop_ids = frozenset()
    try:
        engine.set_learning_rate(1e-2)
        prompts, params = workload(engine, chat_ids, 4)
        first = run_all(engine, prompts, params)
        captures = engine.generator.stats["graph_captures"]
        batch = [TrainSample(p + r.token_ids, [0] * len(p) + [1] * len(r.token_ids), [0.0] * len(p) + r.logprobs,
                             [0.0] * len(p) + [1.0 if i % 2 else -1.0] * len(r.token_ids))
                 for i, (p, r) in enumerate(zip(prompts, first, strict=True))]
        frozen = {n: p.detach().clone() for n, p in engine.generator.model.named_parameters() if not p.requires_grad}
        metrics = asyncio.run(engine.train_step(batch))
        assert metrics["grad_norm"] > 0
        if lora:  # only the adapters moved
            named = dict(engine.generator.model.named_parameters())
            assert all(torch.equal(named[n], p) for n, p in frozen.items())
        after = run_all(engine, prompts, params)
        assert engine.generator.stats["graph_captures"] == captures  # the same buckets replayed, nothing recaptured
        engine.save(tmp_path / "ckpt")
        fresh.load(tmp_path / "ckpt")
        again = run_all(fresh, prompts, params)
        for x, y in zip(after, again, strict=True):
            assert x.token_ids == y.token_ids and x.policy_version == 1
            assert max(abs(a - b) for a, b in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4
        moved = max(abs(a - b) for x, y in zip(first, after, strict=True) for a, b in zip(x.logprobs, y.logprobs, strict=True))
        assert moved > 1e-4  # the update changed the policy
    finally:
        run_blocking(engine.close())
        run_blocking(fresh.close())


def test_compile_and_graphs_match_eager(tiny_model_path: Path, chat_ids) -> None:
    """``compile=True`` on CUDA: the compiled decode step, captured in graphs, gives the eager step's tokens."""
    plain = engine_of(tiny_model_path, device="cuda", dtype="float32", max_batch_size=4, cuda_graphs=False)
    compiled = engine_of(tiny_model_path, device="cuda", dtype="float32", max_batch_size=4, compile=True)
    try:
        prompts, params = workload(plain, chat_ids, 4)
        compiled.generator.rules.stop_ids = frozenset()
        a, b = run_all(plain, prompts, params), run_all(compiled, prompts, params)
        report("compile_graphs", {k: compiled.generator.stats[k] for k in ("graph_captures", "graph_replays",
                                                                  "graph_failures")})
        for x, y in zip(a, b, strict=True):
            assert x.token_ids == y.token_ids
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4
    finally:
        run_blocking(plain.close())
        run_blocking(compiled.close())


def test_full_fine_tuning_in_bf16_lowers_the_loss(tiny_model_path: Path, chat_ids) -> None:
    engine = engine_of(tiny_model_path, device="cuda", max_batch_size=4)
    try:
        engine.set_learning_rate(1e-3)
        prompts, params = workload(engine, chat_ids, 4)
        res = run_all(engine, prompts, params)
        batch = [TrainSample(p + r.token_ids, [0] * len(p) + [1] * len(r.token_ids), [0.0] * len(p) + r.logprobs,
                             [0.0] * len(p) + [1.0] * len(r.token_ids)) for p, r in zip(prompts, res, strict=True)]
        losses = [asyncio.run(engine.train_step(batch))["loss"] for _ in range(4)]
        assert losses[-1] < losses[0]
    finally:
        run_blocking(engine.close())


def test_train_step_options_train_bf16_weights_as_the_default_does(tiny_model_path: Path) -> None:
    """``flat_masters`` (fused AdamW over one fp32 buffer) and ``compile_logprobs`` (Triton kernels), alone and
    together, against the default on CUDA in bf16: the same fp32 masters after 3 steps, to within 1 % of how far
    the steps moved them (tests/learners/test_train_step_options.py proves the same on the CPU)."""
    start = None
    masters: dict[str, list[torch.Tensor]] = {}
    variants = {"default": {}, "flat": {"flat_masters": True}, "compile": {"compile_logprobs": True},
                "flat+compile": {"flat_masters": True, "compile_logprobs": True}}
    for name, options in variants.items():
        engine = engine_of(tiny_model_path, device="cuda", dtype="bfloat16", learning_rate=1e-3, **options)
        try:
            vocab = len(engine.tokenizer)
            g = torch.Generator().manual_seed(0)
            batch = [TrainSample(ids, [0] * 8 + [1] * 40, [0.0] * 8 + [-3.0] * 40, [0.0] * 8 + [adv] * 40)
                     for ids, adv in ((torch.randint(3, vocab, (48,), generator=g).tolist(), a) for a in (1.0, -1.0))]
            if start is None:
                start = [p.detach().float().clone() for p in engine.learner.params]
            for _ in range(3):
                asyncio.run(engine.train_step(batch))
            assert (engine.learner.optimizer.flat is not None) == options.get("flat_masters", False)
            masters[name] = [m.clone() for _, m in engine.learner.masters]
        finally:
            run_blocking(engine.close())
    assert start is not None
    moved = max(float((m - s).abs().max()) for m, s in zip(masters["default"], start, strict=True))
    apart = {name: max(float((a - b).abs().max()) for a, b in zip(ms, masters["default"], strict=True))
             for name, ms in masters.items() if name != "default"}
    report("train_step_options_bf16", {"moved": moved, "max_abs_diff_vs_default": apart})
    assert moved > 1e-4 and all(d <= 1e-2 * moved for d in apart.values()), (moved, apart)


def test_the_engine_process_replays_cuda_graphs_and_takes_the_pushed_weights(tiny_model_path: Path, chat_ids) -> None:
    """``generator.engine_process on`` on CUDA: the engine process runs the same continuous engine with its CUDA
    graphs (fp32: the in-process engine's tokens, logprobs within 1e-5); after a train step the push brings it to
    the learner's weights, and its next tokens match teacher forcing on them."""
    from agentjet.layouts.engine_process import engine_process_engine
    from agentjet.settings import GeneratorSettings, LearnerSettings, PlacementSettings

    inproc = engine_of(tiny_model_path, device="cuda", dtype="float32", max_batch_size=8)
    proc = engine_process_engine(tiny_model_path, GeneratorSettings(max_batch_size=8),
                                 LearnerSettings(learning_rate=1e-2), None,
                                 PlacementSettings(device="cuda", dtype="float32"))
    try:
        prompts, params = workload(inproc, chat_ids)
        proc.generator.rules.stop_ids = frozenset()
        a, b = run_all(inproc, prompts, params), run_all(proc, prompts, params)
        diff = max(abs(p - q) for x, y in zip(a, b, strict=True) for p, q in zip(x.logprobs, y.logprobs, strict=True))
        counters = proc.generator.counters()
        report("engine_process_graphs", {"max_logprob_diff": diff, **{k: counters[k] for k in (
            "graph_captures", "graph_replays", "graph_failures")}})
        assert [x.token_ids for x in a] == [y.token_ids for y in b] and diff < 1e-5
        assert proc.describe()["cuda_graphs"] is True and counters["graph_replays"] > 0
        batch = [TrainSample(p + r.token_ids, [0] * len(p) + [1] * len(r.token_ids), [0.0] * len(p) + r.logprobs,
                             [0.0] * len(p) + [1.0 if i % 2 else -1.0] * len(r.token_ids))
                 for i, (p, r) in enumerate(zip(prompts, b, strict=True))]
        metrics = asyncio.run(proc.train_step(batch))
        assert metrics["rollout_policy_version"] == 1.0 and proc.generator_version == 1
        after = run_all(proc, prompts, params)
        worst = max(max(abs(x - y) for x, y in zip(r.logprobs, teacher_forced(proc, p, r.token_ids, 1.0), strict=True))
                    for p, r in zip(prompts, after, strict=True))
        report("engine_process_push", {"max_logprob_diff_vs_learner": worst, "sync_seconds": metrics["sync_seconds"]})
        assert all(set(r.versions) == {1} for r in after) and worst < 1e-4
    finally:
        run_blocking(inproc.close())
        run_blocking(proc.close())
