"""forward, forward_backward and optim_step through the official SDK, on a Tinker client's own LoRA adapter."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.server
tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

ADAM = types.AdamParams(learning_rate=5e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0, grad_clip_norm=1.0)


def datum(tokens: list[int], **inputs) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], **inputs})


def seq_logprob(tc, tokens: list[int]) -> float:
    out = tc.forward([datum(tokens, weights=[1.0] * (len(tokens) - 1))], "cross_entropy").result()
    return float(np.sum(out.loss_fn_outputs[0]["logprobs"].to_numpy()))


@pytest.fixture
def training_client(service_client):
    client = service_client()
    tc = client.create_lora_training_client(base_model="tiny", rank=4).result()
    return client, tc


def test_cross_entropy_steps_lower_the_loss_and_the_loss_is_a_sum(training_client) -> None:
    _, tc = training_client
    data = [datum([1, 5, 9, 13, 17, 21], weights=[1.0] * 5), datum([2, 4, 6, 8], weights=[0.0, 1.0, 1.0])]
    losses = []
    for _ in range(4):
        fb = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step(ADAM)
        out = fb.result()
        opt.result()
        losses.append(out.metrics["loss:sum"])
        lps = [o["logprobs"].to_numpy() for o in out.loss_fn_outputs]
        assert [len(x) for x in lps] == [5, 3]
        # a sum over tokens, weighted: the first token of datum 2 has weight 0
        assert out.metrics["loss:sum"] == pytest.approx(-(lps[0].sum() + lps[1][1:].sum()), rel=1e-4, abs=1e-4)
    assert losses[-1] < losses[0]


def test_a_positive_advantage_importance_sampling_step_raises_that_sequences_logprob(training_client) -> None:
    _, tc = training_client
    tokens = [3, 14, 15, 92, 65, 35]
    before = seq_logprob(tc, tokens)
    q = tc.forward([datum(tokens, weights=[1.0] * 5)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    d = datum(tokens, logprobs=q.to_numpy().tolist(), advantages=[1.0] * 5)
    tc.forward_backward([d], "importance_sampling").result()
    tc.optim_step(ADAM).result()
    assert seq_logprob(tc, tokens) > before + 1e-3


def test_ppo_with_clip_thresholds_and_forward_changes_nothing(training_client) -> None:
    _, tc = training_client
    tokens = [7, 8, 9, 10, 11]
    before = seq_logprob(tc, tokens)
    assert seq_logprob(tc, tokens) == pytest.approx(before, abs=1e-6)  # forward has no side effect
    q = [-5.0] * 4
    out = tc.forward_backward([datum(tokens, logprobs=q, advantages=[1.0] * 4)], "ppo",
                              loss_fn_config={"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}).result()
    assert np.isfinite(out.metrics["loss:sum"])
    tc.optim_step(ADAM).result()


def test_two_clients_train_their_own_adapters(service_client) -> None:
    client = service_client()
    a = client.create_lora_training_client(base_model="tiny", rank=4).result()
    b = client.create_lora_training_client(base_model="tiny", rank=4).result()
    tokens = [1, 2, 3, 4, 5, 6]
    b_before = seq_logprob(b, tokens)
    for _ in range(3):
        a.forward_backward([datum(tokens, weights=[1.0] * 5)], "cross_entropy").result()
        a.optim_step(ADAM).result()
    assert seq_logprob(a, tokens) > b_before + 1e-3
    assert seq_logprob(b, tokens) == pytest.approx(b_before, abs=1e-5)


def test_bad_training_input_fails_the_future_cleanly_and_never_5xx(training_client, tinker_server) -> None:
    _, tc = training_client
    with pytest.raises(tinker.RequestFailedError, match="vocabulary"):
        tc.forward_backward([datum([1, 2, 10**9])], "cross_entropy").result()
    with pytest.raises(tinker.RequestFailedError, match="advantages"):
        tc.forward_backward([datum([1, 2, 3])], "importance_sampling").result()
    # the client still works after its bad requests
    tc.forward_backward([datum([1, 2, 3], weights=[1.0, 1.0])], "cross_entropy").result()
