"""Every loss name of the SDK (tinker 0.38.0's LossFnType) through the official SDK: batches and micro-batches with no
position carrying a gradient (issue 50: they crashed with "element 0 of tensors does not require grad"), and the
losses added for the cookbook (cispo, dro, gspo, stable_reinforce) against values computed here by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytestmark = pytest.mark.server
tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from agentjet.learners.tinker_ops import LOSSES, POLICY_LOSSES  # noqa: E402

ADAM = types.AdamParams(learning_rate=5e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0, grad_clip_norm=1.0)
TOKENS = [[1, 5, 9, 13, 17, 21], [2, 4, 6, 8, 10, 12]]


def datum(tokens: list[int], **inputs) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], **inputs})


# DRO's quadratic term pulls lp towards q wherever they differ: with beta 0 it is a zero-advantage policy gradient
NO_PENALTY = {"dro": {"beta": 0.0}}


def zero_signal(loss: str, tokens: list[int]) -> types.Datum:
    """A datum whose every position is worth 0: weights 0 (cross_entropy) or advantages 0 (the policy losses)."""
    n = len(tokens) - 1
    if loss == "cross_entropy":
        return datum(tokens, weights=[0.0] * n)
    return datum(tokens, logprobs=[0.0] * n, advantages=[0.0] * n)


@pytest.fixture
def client(tinker_server, service_client):
    srv = tinker_server()
    tc = service_client(srv).create_lora_training_client(base_model="tiny", rank=4).result()
    tc.forward_backward([datum(TOKENS[0], weights=[1.0] * 5)], "cross_entropy").result()
    tc.optim_step(ADAM).result()  # B moves off zero: every LoRA weight can have a gradient from now on
    service = srv.server.tinker
    return srv, tc, service.models.learner(service.models.get(tc.model_id))


def grads(learner) -> list:
    return learner.worker.submit(lambda: [None if p.grad is None else p.grad.detach().clone()
                                          for p in learner.params]).result()


def clear(learner) -> None:
    def run() -> None:
        for p in learner.params:
            p.grad = None
    learner.worker.submit(run).result()


def forward_logprobs(tc, tokens: list[int]) -> np.ndarray:
    out = tc.forward([datum(tokens, weights=[1.0] * (len(tokens) - 1))], "cross_entropy").result()
    return out.loss_fn_outputs[0]["logprobs"].to_numpy().astype(np.float64)


def test_the_sdk_names_every_loss_this_server_computes() -> None:
    from typing import get_args

    from tinker.types import LossFnType

    assert set(LOSSES) == set(get_args(LossFnType)) - {"custom"}  # "custom": the SDK's client-side loss


def test_a_batch_with_no_gradient_returns_its_loss_and_adds_nothing_for_every_loss(client) -> None:
    """All weights or all advantages 0: the loss (0), the logprobs, no failure, no gradient; the optimizer step
    after it leaves the weights as they were."""
    _, tc, learner = client
    before = forward_logprobs(tc, TOKENS[0])
    for loss in LOSSES:
        clear(learner)
        data = [zero_signal(loss, t) for t in TOKENS]
        out = tc.forward_backward(data, loss, loss_fn_config=NO_PENALTY.get(loss)).result()
        assert out.metrics["loss:sum"] == pytest.approx(0.0, abs=1e-6), loss
        assert [len(o["logprobs"].to_numpy()) for o in out.loss_fn_outputs] == [5, 5], loss
        assert np.allclose(out.loss_fn_outputs[0]["logprobs"].to_numpy(), before, atol=1e-5), loss
        g = grads(learner)
        assert all(x is None or float(x.abs().max()) == 0.0 for x in g), loss
        step = tc.optim_step(ADAM).result()
        assert step.metrics["grad_norm:mean"] == 0.0, loss
    assert np.allclose(forward_logprobs(tc, TOKENS[0]), before, atol=1e-6)  # no step moved a weight


def test_a_micro_batch_with_no_signal_after_one_with_signal_adds_only_the_first_ones_gradient(client) -> None:
    """Two micro-batches (the learner's token budget fits one datum): the first has signal, the second none. The
    gradient equals the first's alone, for every loss; the loss is the first's."""
    import torch

    _, tc, learner = client
    learner.micro_batch_tokens = 6  # one 5-token datum a micro-batch
    lp = [forward_logprobs(tc, t) for t in TOKENS]
    for loss in LOSSES:
        if loss == "cross_entropy":
            signal = datum(TOKENS[0], weights=[0.0, 1.0, 1.0, 0.5, 1.0])
        else:
            signal = datum(TOKENS[0], logprobs=(lp[0] - 0.05).tolist(), advantages=[0.0, 1.0, -0.5, 0.8, 0.3])
        silent = zero_signal(loss, TOKENS[1])
        config = NO_PENALTY.get(loss)
        clear(learner)
        alone = tc.forward_backward([signal], loss, loss_fn_config=config).result()
        g_alone = grads(learner)
        clear(learner)
        both = tc.forward_backward([signal, silent], loss, loss_fn_config=config).result()
        g_both = grads(learner)
        assert any(x is not None and float(x.abs().max()) > 0 for x in g_alone), loss
        for a, b in zip(g_alone, g_both, strict=True):
            assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, atol=1e-7)), loss
        assert both.metrics["loss:sum"] == pytest.approx(alone.metrics["loss:sum"], abs=1e-5), loss
        assert np.allclose(both.loss_fn_outputs[1]["elementwise_loss"].to_numpy(), 0.0, atol=1e-6), loss
    clear(learner)


def hand(loss: str, lp: np.ndarray, q: np.ndarray, a: np.ndarray, config: dict[str, float]) -> np.ndarray:
    """The loss terms of docs/tinker.md, "Losses", written out in numpy."""
    r = np.exp(lp - q)
    if loss == "cispo":
        low, high = config.get("clip_low_threshold", 0.0), config.get("clip_high_threshold", 4.0)
        return -np.clip(r, low, high) * a * lp
    if loss == "stable_reinforce":
        return -r * a * lp
    if loss == "dro":
        return -(lp * a - 0.5 * config.get("beta", 0.05) * (lp - q) ** 2)
    if loss == "gspo":
        low, high = config.get("clip_low_threshold", 1 - 3e-4), config.get("clip_high_threshold", 1 + 4e-4)
        seq = a != 0
        s = math.exp(float(np.mean((lp - q)[seq])))
        return np.where(seq, -np.minimum(s * a, np.clip(s, low, high) * a), 0.0)
    raise AssertionError(loss)


@pytest.mark.parametrize("loss,config", [("cispo", {}), ("cispo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.02}),
                                         ("dro", {}), ("dro", {"beta": 0.5}), ("gspo", {}),
                                         ("gspo", {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0}),
                                         ("stable_reinforce", {})])
def test_the_new_losses_equal_their_formulas_on_a_tiny_batch(client, loss: str, config: dict) -> None:
    """Values: each position's loss and the sum against the formula computed here. Gradients: each of these losses
    has the gradient of a weighted cross-entropy with weights -dloss/dlp, which the test computes by hand too."""
    import torch

    _, tc, learner = client
    lp = forward_logprobs(tc, TOKENS[0])
    q = lp + np.array([0.0, -0.3, 0.2, 0.01, -0.02])  # ratios from 0.74 to 1.35: some clipped, some not
    a = np.array([0.0, 1.0, -0.5, 0.8, 2.0])
    clear(learner)
    out = tc.forward_backward([datum(TOKENS[0], logprobs=q.tolist(), advantages=a.tolist())], loss,
                              loss_fn_config=config or None).result()
    expected = hand(loss, lp, q, a, config)
    got = out.loss_fn_outputs[0]["elementwise_loss"].to_numpy()
    assert np.allclose(got, expected, atol=1e-4), (loss, got, expected)
    assert out.metrics["loss:sum"] == pytest.approx(float(expected.sum()), abs=1e-4)
    g_loss = grads(learner)
    # -dloss/dlp per position, by hand (the clipped ratio is detached in cispo and stable_reinforce)
    r = np.exp(lp - q)
    if loss == "cispo":
        w = np.clip(r, config.get("clip_low_threshold", 0.0), config.get("clip_high_threshold", 4.0)) * a
    elif loss == "stable_reinforce":
        w = r * a
    elif loss == "dro":
        w = a - config.get("beta", 0.05) * (lp - q)
    else:  # gspo: d(-s A_t)/dlp_k = -s A_t / n on the sequence's positions, 0 where the clip binds
        seq = a != 0
        s = math.exp(float(np.mean((lp - q)[seq])))
        low, high = config.get("clip_low_threshold", 1 - 3e-4), config.get("clip_high_threshold", 1 + 4e-4)
        live = np.where((s * a <= np.clip(s, low, high) * a) | ((s >= low) & (s <= high)), a, 0.0) * seq
        w = np.where(seq, s * live.sum() / seq.sum(), 0.0)
    clear(learner)
    tc.forward_backward([datum(TOKENS[0], weights=w.tolist())], "cross_entropy").result()
    g_ce = grads(learner)
    assert any(x is not None and float(x.abs().max()) > 0 for x in g_loss), loss
    for x, y in zip(g_loss, g_ce, strict=True):
        assert (x is None) == (y is None) and (x is None or torch.allclose(x, y, atol=1e-5, rtol=1e-3)), loss
    clear(learner)


def test_policy_losses_need_their_inputs_and_bad_thresholds_fail_the_future(client) -> None:
    _, tc, _ = client
    for loss in POLICY_LOSSES:
        with pytest.raises(tinker.RequestFailedError, match="logprobs and advantages"):
            tc.forward_backward([datum(TOKENS[0], weights=[1.0] * 5)], loss).result()
    with pytest.raises(tinker.RequestFailedError, match="clip_low_threshold <= clip_high_threshold"):
        tc.forward_backward([datum(TOKENS[0], logprobs=[-1.0] * 5, advantages=[1.0] * 5)], "cispo",
                            loss_fn_config={"clip_low_threshold": 2.0, "clip_high_threshold": 1.0}).result()
    with pytest.raises(tinker.RequestFailedError, match="beta"):
        tc.forward_backward([datum(TOKENS[0], logprobs=[-1.0] * 5, advantages=[1.0] * 5)], "dro",
                            loss_fn_config={"beta": -1.0}).result()
