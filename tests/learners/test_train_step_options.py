"""The train step's launch-bound fixes (docs/benchmarks.md, GPU round 4), each against what it replaced:

- exact, and on by default: the padded batch and the trained tokens' targets built in one call per field (no
  Python loop over the tokens), the loss metrics read back to the host in one transfer, the logprob gradient cast
  once per dtype in backward. Each is compared with the code it replaced, written out here, for bitwise equality;
- options, off by default (``learner.flat_masters``, ``learner.compile_logprobs``): the same weights after N
  steps within fp32 rounding, and checkpoints that either setting reads.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import torch

from agentjet.algorithms.loss import policy_loss
from agentjet.algorithms.objectives import Correction, PolicyLossConfig
from agentjet.algorithms.tis import correction_weights, mismatch_kl_terms
from agentjet.engines.base import TrainSample
from agentjet.engines.logprobs import LogprobKernels, chunked_token_logprobs
from agentjet.layouts import embedded_engine
from agentjet.learners.masters import FlatMasters
from agentjet.learners.policy_step import PolicyOptimizer, StepConfig, collate, token_targets
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import GeneratorSettings, LearnerSettings, LossSettings, PlacementSettings


def random_samples(seed: int, n: int = 6, vocab: int = 1000) -> list[TrainSample]:
    """Samples of different lengths, loss masks with holes, and their own temperatures and weights."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(2, 40)
        mask = [0] + [int(rng.random() < 0.7) for _ in range(length - 1)]
        out.append(TrainSample([rng.randrange(vocab) for _ in range(length)], mask,
                               [rng.uniform(-5, 0) for _ in range(length)], [rng.uniform(-2, 2) for _ in range(length)],
                               temperature=rng.choice([1.0, 0.7, 1.3]), weight=rng.choice([1.0, 0.5, 1 / 3])))
    return out


def collate_per_row(samples: list[TrainSample], pad_id: int) -> tuple[torch.Tensor, ...]:
    """The padded batch as it was built before: a tensor per row and per field, written row by row."""
    width = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.bool)
    temps = torch.zeros((len(samples), width))
    for i, s in enumerate(samples):
        n = len(s.input_ids)
        ids[i, :n] = torch.tensor(s.input_ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.bool)
        temps[i, :n] = s.temperature
    return ids, attn, mask, temps


def targets_per_token(samples: list[TrainSample]) -> tuple[torch.Tensor, ...]:
    """The trained tokens' targets as they were built before: a Python loop over every token."""
    flat = [(i, s, j) for i, s in enumerate(samples) for j, m in enumerate(s.loss_mask) if m]
    return (torch.tensor([s.behaviour_logprobs[j] for _, s, j in flat]), torch.tensor([s.advantages[j] for _, s, j in flat]),
            torch.tensor([s.weight for _, s, _ in flat]), torch.tensor([i for i, _, _ in flat], dtype=torch.long))


@pytest.mark.parametrize("seed", range(5))
def test_the_batch_and_its_targets_are_bitwise_what_the_per_token_code_built(seed: int) -> None:
    samples = random_samples(seed)
    batch = collate(samples, pad_id=7)
    for got, want in zip((batch.ids, batch.attention_mask, batch.loss_mask, batch.temperatures),
                         collate_per_row(samples, 7), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)
    for got, want in zip(token_targets(samples), targets_per_token(samples), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert len(token_targets(samples)[0]) == sum(s.num_trained_tokens for s in samples)


@pytest.mark.parametrize("correction", [Correction.NONE, Correction.TIS, Correction.MASK_TOKEN])
def test_the_loss_metrics_read_back_at_once_are_the_per_sum_floats(correction: Correction) -> None:
    torch.manual_seed(0)
    n = 50
    logprobs = (torch.randn(n) - 2).requires_grad_()
    behaviour, adv, w = torch.randn(n) - 2, torch.randn(n), torch.rand(n) + 0.5
    seq = torch.arange(n) // 10
    ref = torch.randn(n) - 2
    config = PolicyLossConfig(correction=correction, kl_coef=0.1)
    out = policy_loss(logprobs, behaviour, adv, w, seq, config, ref)
    proximal = logprobs.detach()
    old = behaviour if correction is Correction.NONE else proximal
    ratio = torch.exp((logprobs.detach() - old).clamp(max=20.0))
    assert out.loss_value == float(out.loss_sum.detach())
    assert out.ratio_max == float(ratio.max())
    assert out.abs_logprob_diff_sum == float((logprobs.detach() - behaviour).abs().sum())
    assert out.mismatch_kl_sum == float(mismatch_kl_terms(proximal.double(), behaviour.double()).sum())
    if correction is Correction.NONE:
        assert (out.masked, out.is_weight_sum) == (0.0, float(n))
    else:
        c = correction_weights(proximal, behaviour, seq, correction, config.correction_low, config.correction_high)
        assert (out.masked, out.is_weight_sum) == (float((~c.kept).sum()), float(c.weights.sum()))
    assert out.kl_sum != 0.0 and isinstance(out.clipped, float)


def old_backward_grads(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, g: torch.Tensor,
                       chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The logprob function as it was before, at temperature 1: the forward's log-normaliser chunk by chunk (in
    place), then the backward casting the fp32 gradient to each matmul's dtype separately."""
    hs, w = hidden.detach(), weight.detach()
    lse = torch.empty(hs.shape[0])
    for start in range(0, hs.shape[0], chunk):
        logits = (hs[start:start + chunk] @ w.t()).float()
        row_max = logits.amax(dim=-1)
        lse[start:start + chunk] = logits.sub_(row_max[:, None]).exp_().sum(dim=-1).log_().add_(row_max)
    grad_hs, grad_w = torch.empty_like(hs), torch.zeros_like(w)
    for start in range(0, hs.shape[0], chunk):
        sl = slice(start, start + chunk)
        gl = (hs[sl] @ w.t()).float()
        gl.sub_(lse[sl, None]).exp_().mul_(-g[sl, None])
        gl.scatter_add_(-1, targets[sl, None], g[sl, None])
        torch.mm(gl.to(hs.dtype), w.to(hs.dtype), out=grad_hs[sl])
        grad_w.addmm_(gl.t().to(w.dtype), hs[sl].to(w.dtype))
    return grad_hs * torch.ones(hs.shape[0])[:, None].to(hs.dtype), grad_w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_backward_cast_once_gives_the_old_gradients_bitwise(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    n, h, v = 23, 16, 64
    hidden = torch.randn(n, h).to(dtype).requires_grad_()
    weight = torch.randn(v, h).to(dtype).requires_grad_()
    targets, g = torch.randint(0, v, (n,)), torch.randn(n)
    chunked_token_logprobs(hidden, weight, targets, torch.ones(n), 8).backward(g)
    want_hs, want_w = old_backward_grads(hidden, weight, targets, g, 8)
    assert hidden.grad is not None and weight.grad is not None
    assert hidden.grad.dtype == want_hs.dtype and torch.equal(hidden.grad, want_hs)
    assert weight.grad.dtype == want_w.dtype and torch.equal(weight.grad, want_w)


def step_config(max_grad_norm: float, flat: bool) -> StepConfig:
    return StepConfig(learning_rate=1e-2, weight_decay=0.01, max_grad_norm=max_grad_norm, micro_batch_tokens=None,
                      logprob_chunk_tokens=1024, bf16=False, flat_masters=flat)


SHAPES = [(4, 3), (7,), (2, 2), (5, 1)]


def bf16_weights() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(*s).to(torch.bfloat16)) for s in SHAPES]


def run_steps(opt: PolicyOptimizer, params: list[torch.nn.Parameter], config: StepConfig, seeds: range) -> None:
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
        opt.step(config)
        assert all(p.grad is None for p in params)


@pytest.mark.parametrize("max_grad_norm", [1e6, 0.5], ids=["no-clip", "clipped"])
def test_flat_masters_step_the_weights_as_per_weight_masters_do(max_grad_norm: float) -> None:
    masters, weights = [], []
    for flat in (False, True):
        params = bf16_weights()
        opt = PolicyOptimizer(params, step_config(max_grad_norm, flat))
        assert (opt.flat is not None) == flat
        run_steps(opt, params, step_config(max_grad_norm, flat), range(5))
        masters.append([m.clone() for m in opt.masters])
        weights.append([p.detach().clone() for p in params])
    for a, b in zip(*masters, strict=True):
        if max_grad_norm > 1e5:  # no clipping: AdamW's arithmetic, element by element, on the same numbers
            assert torch.equal(a, b)
        else:  # the clip factor comes from a norm summed in another order: equal within fp32 rounding
            assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
    for a, b in zip(*weights, strict=True):
        assert a.dtype == torch.bfloat16 and torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-3)
    assert not torch.equal(weights[0][0], bf16_weights()[0])  # they moved


@pytest.mark.parametrize("saved_flat", [True, False], ids=["flat-to-per-weight", "per-weight-to-flat"])
def test_either_master_layout_resumes_from_the_others_checkpoint(saved_flat: bool, tmp_path: Path) -> None:
    """The state is written per weight whichever way the masters are held: a run resumed with the other setting
    continues as the uninterrupted run does."""
    params = bf16_weights()
    first = PolicyOptimizer(params, step_config(0.5, saved_flat))
    run_steps(first, params, step_config(0.5, saved_flat), range(3))
    torch.save(first.state_dict(), tmp_path / "opt.pt")
    run_steps(first, params, step_config(0.5, saved_flat), range(3, 5))  # the uninterrupted run

    resumed = [torch.nn.Parameter(m.to(torch.bfloat16)) for m in torch.load(tmp_path / "opt.pt")["masters"]]
    second = PolicyOptimizer(resumed, step_config(0.5, not saved_flat))
    second.load_state_dict(torch.load(tmp_path / "opt.pt"))
    state = second.state_dict()["optimizer"]["state"]
    assert sorted(state) == list(range(len(SHAPES))) and all(int(s["step"]) == 3 for s in state.values())
    run_steps(second, resumed, step_config(0.5, not saved_flat), range(3, 5))
    for a, b in zip(first.masters, second.masters, strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)


def test_flat_masters_refuse_a_step_where_a_weight_has_no_gradient() -> None:
    params = bf16_weights()
    flat = FlatMasters(params)
    for p in params[:-1]:
        p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match="flat_masters: 1 trained weight"):
        flat.take_grads()


def test_flat_masters_stay_off_for_fp32_weights() -> None:
    params = [torch.nn.Parameter(torch.randn(3, 2))]
    opt = PolicyOptimizer(params, step_config(1.0, True))
    assert opt.flat is None and opt.masters == []


def _samples(vocab: int, n: int = 3, length: int = 24) -> list[TrainSample]:
    rng = random.Random(1)
    out = []
    for k in range(n):
        mask = [0] * 8 + [1] * (length - 8)
        out.append(TrainSample([rng.randrange(3, vocab) for _ in range(length)], mask, [0.0] * 8 + [-3.0] * (length - 8),
                               [0.0] * 8 + [(-1.0) ** k] * (length - 8)))
    return out


def _engine(path: Path, dtype: str, **learner: object):  # noqa: ANN202
    return embedded_engine(path, GeneratorSettings(max_batch_size=2),
                           LearnerSettings(learning_rate=1e-3, **learner), LossSettings(),
                           placement=PlacementSettings(dtype=dtype))


def _train(engine, batch: list[TrainSample], steps: int) -> list[torch.Tensor]:  # noqa: ANN001
    for _ in range(steps):
        asyncio.run(engine.train_step(batch))
    learner = engine.learner
    return [m.clone() for _, m in learner.masters] or [p.detach().clone() for p in learner.params]


def test_a_bf16_learner_with_flat_masters_trains_to_the_same_weights(tiny_model_path: Path, tmp_path: Path) -> None:
    plain, flat = _engine(tiny_model_path, "bfloat16"), _engine(tiny_model_path, "bfloat16", flat_masters=True)
    try:
        batch = _samples(len(plain.tokenizer))
        want, got = _train(plain, batch, 3), _train(flat, batch, 3)
        assert flat.learner.optimizer.flat is not None and plain.learner.optimizer.flat is None
        for a, b in zip(want, got, strict=True):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
        flat.save(tmp_path / "ckpt")  # read back by a learner without the option
        plain.load(tmp_path / "ckpt")
        for (_, a), (_, b) in zip(flat.learner.masters, plain.learner.masters, strict=True):
            assert torch.equal(a, b)
    finally:
        run_blocking(plain.close())
        run_blocking(flat.close())


def test_compiled_logprob_chunks_train_to_the_same_weights(tiny_model_path: Path) -> None:
    """``compile_logprobs`` (CPU inductor here): the same logprobs within fp32 rounding, and after 2 AdamW steps the
    same weights to within 1 % of how far the steps moved them (AdamW divides by each gradient's size, so a
    weight whose gradient is rounding noise moves by up to the learning rate either way)."""
    start = _start_weights(tiny_model_path)
    plain, compiled = _engine(tiny_model_path, "float32"), _engine(tiny_model_path, "float32", compile_logprobs=True)
    try:
        assert isinstance(compiled.learner._kernels, LogprobKernels) and plain.learner._kernels is None
        batch = _samples(len(plain.tokenizer))
        want_lp, got_lp = run_blocking(plain.learner.score(batch)), run_blocking(compiled.learner.score(batch))
        assert torch.allclose(torch.tensor(want_lp), torch.tensor(got_lp), atol=1e-5)
        want, got = _train(plain, batch, 2), _train(compiled, batch, 2)
        moved = max(float((a - s).abs().max()) for a, s in zip(want, start, strict=True))
        apart = max(float((a - b).abs().max()) for a, b in zip(want, got, strict=True))
        assert moved > 1e-4 and apart <= 1e-2 * moved, (moved, apart)
    finally:
        run_blocking(plain.close())
        run_blocking(compiled.close())


def _start_weights(path: Path) -> list[torch.Tensor]:
    engine = _engine(path, "float32")
    try:
        return [p.detach().clone() for p in engine.learner.params]
    finally:
        run_blocking(engine.close())
