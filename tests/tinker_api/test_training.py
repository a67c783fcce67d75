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


def test_train_unembed_puts_lora_on_the_output_layer_and_trains_it(tinker_server, service_client) -> None:
    """The SDK's default train_unembed=True: the client's adapter carries LoRA on the output layer too, its
    logprobs go through it (forward equals sample) and a step moves it; train_unembed=False leaves it off."""
    from agentjet.engines.model import adapter_has_unembed

    srv = tinker_server()
    client = service_client(srv)
    with_head = client.create_lora_training_client(base_model="tiny", rank=4).result()
    without = client.create_lora_training_client(base_model="tiny", rank=4, train_unembed=False).result()
    service = srv.server.tinker
    model = service.adapters.engine(service.models.get(with_head.model_id).adapter).learner.policy.model
    head = model.get_output_embeddings()
    name = service.models.get(with_head.model_id).adapter
    assert adapter_has_unembed(model, name)
    assert not adapter_has_unembed(model, service.models.get(without.model_id).adapter)
    before = head.lora_B[name].weight.detach().clone()  # B starts at zero: the adapter changes nothing yet
    tokens = [1, 5, 9, 13, 17, 21]
    for _ in range(2):
        with_head.forward_backward([datum(tokens, weights=[1.0] * 5)], "cross_entropy").result()
        with_head.optim_step(ADAM).result()
    assert float((head.lora_B[name].weight.detach() - before).abs().max()) > 0  # the output layer's LoRA trained
    # what the sampler sees is what forward computes, through the output layer's LoRA
    sampler = with_head.save_weights_and_get_sampling_client()
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=3)
    seq = sampler.sample(types.ModelInput.from_ints(tokens), 1, params).result().sequences[0]
    out = with_head.forward([datum(tokens + list(seq.tokens), weights=[1.0] * (len(tokens) + len(seq.tokens) - 1))],
                            "cross_entropy").result()
    forward_lps = out.loss_fn_outputs[0]["logprobs"].to_numpy()[len(tokens) - 1:]
    assert np.allclose(forward_lps, np.array(seq.logprobs), atol=1e-3)


def test_a_client_side_custom_loss_runs_as_forward_then_weighted_cross_entropy(training_client) -> None:
    """``forward_backward_custom`` with a Python loss: the SDK runs ``forward``, differentiates the loss on the
    client and sends ``weights = -dC/dlogprobs`` (negative where the loss wants a logprob lower) to a
    cross-entropy backward. Minimising ``-logprob`` of one sequence and ``+logprob`` of another moves them apart."""
    import torch

    _, tc = training_client
    up, down = [1, 5, 9, 13, 17], [2, 4, 6, 8, 10]
    before = seq_logprob(tc, up), seq_logprob(tc, down)

    def loss_fn(data, logprobs):
        loss = -logprobs[0].sum() + logprobs[1].sum()
        return loss, {"custom": float(loss.detach())}

    for _ in range(3):
        out = tc.forward_backward_custom([datum(up, weights=[1.0] * 4), datum(down, weights=[1.0] * 4)],
                                         loss_fn).result()
        tc.optim_step(ADAM).result()
    assert "custom" in out.metrics
    after = seq_logprob(tc, up), seq_logprob(tc, down)
    assert after[0] > before[0] + 1e-3 and after[1] < before[1] - 1e-3
    assert torch.isfinite(torch.tensor(after)).all()


def test_positions_without_a_gradient_are_computed_without_the_graph_and_the_gradients_are_the_same(
        tinker_server, service_client) -> None:
    """forward_backward keeps the graph only where a weight or an advantage is non-zero (a prompt's positions are
    computed without it): the logprobs and the adapter's gradients equal those of the whole graph."""
    import torch

    from agentjet.learners.tinker_ops import TinkerDatum, _graded, _logprobs

    srv = tinker_server()
    tc = service_client(srv).create_lora_training_client(base_model="tiny", rank=4).result()
    tc.forward_backward([datum([1, 5, 9, 13], weights=[1.0] * 3)], "cross_entropy").result()
    tc.optim_step(ADAM).result()  # B moves off zero: every LoRA weight has a gradient
    service = srv.server.tinker
    learner = service.models.learner(service.models.get(tc.model_id))
    data = [TinkerDatum(tokens=[1, 5, 9, 13, 17], target_tokens=[5, 9, 13, 17, 21], logprobs=[-1.0] * 5,
                        advantages=[0.0, 0.0, 0.5, -1.0, 0.25]),
            TinkerDatum(tokens=[2, 4, 6], target_tokens=[4, 6, 8], logprobs=[-2.0] * 3, advantages=[0.0, 1.0, 0.0])]

    def run(graded):
        learner.activate()
        params = learner.params
        lps = _logprobs(learner, data, graded)
        loss = sum(-(torch.exp(lp - torch.tensor(d.logprobs)) * torch.tensor(d.advantages)).sum()
                   for lp, d in zip(lps, data, strict=True))
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        return [lp.detach() for lp in lps], [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]

    with_graph = learner.worker.submit(run, None).result()
    split = learner.worker.submit(run, [_graded(d, "importance_sampling") for d in data]).result()
    for a, b in zip(with_graph[0], split[0], strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    assert any(float(g.abs().max()) > 0 for g in split[1])
    for a, b in zip(with_graph[1], split[1], strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)
