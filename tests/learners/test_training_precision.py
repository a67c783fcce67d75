"""Training low-precision weights: fp32 master copies keep the small AdamW updates that bf16 weights alone
would round away, and they travel with the optimizer state through save and load."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from agentjet.engines.base import SamplingParams, TrainSample
from agentjet.layouts import embedded_engine
from agentjet.layouts.composed import ComposedEngine
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import GeneratorSettings, LearnerSettings, PlacementSettings


def _batch(engine: ComposedEngine, chat_ids) -> list[TrainSample]:
    ids = chat_ids("what is 4 + 4?", engine)
    out = []
    for seed, adv in ((1, 1.0), (2, -1.0)):
        r = asyncio.run(engine.generate(ids, SamplingParams(max_tokens=8, seed=seed)))
        out.append(TrainSample(ids + r.token_ids, [0] * len(ids) + [1] * len(r.token_ids),
                               [0.0] * len(ids) + r.logprobs, [0.0] * len(ids) + [adv] * len(r.token_ids)))
    return out


def bf16_engine(path: Path):  # noqa: ANN201
    return embedded_engine(path, GeneratorSettings(max_batch_size=2), LearnerSettings(learning_rate=2e-5),
                           placement=PlacementSettings(dtype="bfloat16"))


def test_bf16_weights_train_through_fp32_masters(tiny_model_path: Path, chat_ids, tmp_path: Path) -> None:
    engine = bf16_engine(tiny_model_path)
    try:
        trainer = engine.learner
        assert trainer.masters == []  # made at the first step: an engine that only generates holds none
        batch = _batch(engine, chat_ids)
        asyncio.run(engine.train_step(batch))
        assert trainer.masters and all(m.dtype == torch.float32 for _, m in trainer.masters)
        start = [m.clone() for _, m in trainer.masters]
        for _ in range(3):
            asyncio.run(engine.train_step(batch))
        moved = sum(int((m != s).sum()) for (_, m), s in zip(trainer.masters, start, strict=True))
        total = sum(m.numel() for _, m in trainer.masters)
        assert moved > 0.9 * total  # every weight with a gradient moved in fp32
        for p, m in trainer.masters:  # and the bf16 weights are the masters, rounded, in place
            assert p.dtype == torch.bfloat16 and torch.equal(p.detach(), m.to(torch.bfloat16))

        engine.save(tmp_path / "ckpt")
        other = bf16_engine(tiny_model_path)
        try:
            other.load(tmp_path / "ckpt")
            for (_, a), (_, b) in zip(trainer.masters, other.learner.masters, strict=True):
                assert torch.equal(a, b)  # the exact masters came back, not the rounded weights
            asyncio.run(engine.train_step(batch))
            asyncio.run(other.train_step(batch))
            for (_, a), (_, b) in zip(trainer.masters, other.learner.masters, strict=True):
                assert torch.allclose(a, b, atol=1e-7)
        finally:
            run_blocking(other.close())
    finally:
        run_blocking(engine.close())


def test_fp32_weights_have_no_masters(tiny_engine: ComposedEngine, chat_ids) -> None:
    asyncio.run(tiny_engine.train_step(_batch(tiny_engine, chat_ids)))
    assert tiny_engine.learner.masters == []


def test_foreach_master_path_matches_the_per_tensor_path() -> None:
    """The foreach cast and copy-back (one call each over all tensors) step the bf16 weights exactly as the
    per-tensor loop does, a weight without a grad included (it keeps its value)."""
    from agentjet.learners.policy_step import PolicyOptimizer, StepConfig

    config = StepConfig(learning_rate=1e-2, weight_decay=0.01, max_grad_norm=0.5, micro_batch_tokens=None,
                        logprob_chunk_tokens=1024, bf16=False)
    torch.manual_seed(0)
    start = [torch.randn(4, 3), torch.randn(7), torch.randn(2, 2)]
    grads = [[torch.randn(4, 3), torch.randn(7), None] for _ in range(3)]
    weights = []
    for foreach in (True, False):
        params = [torch.nn.Parameter(t.to(torch.bfloat16)) for t in start]
        opt = PolicyOptimizer(params, config)
        opt._foreach = foreach
        for step_grads in grads:
            for p, g in zip(params, step_grads, strict=True):
                p.grad = None if g is None else g.to(torch.bfloat16)
            opt.step(config)
            assert all(p.grad is None for p in params)
        weights.append([p.detach().clone() for p in params])
    for a, b in zip(*weights, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(weights[0][2], start[2].to(torch.bfloat16))  # never had a grad: unchanged
    assert not torch.equal(weights[0][0], start[0].to(torch.bfloat16))  # stepped
