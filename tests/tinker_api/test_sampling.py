"""Sampling through the official SDK: snapshots, stop rules, seeds, logprobs equal to forward's."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytestmark = pytest.mark.server
tinker = pytest.importorskip("tinker")
from tests.tinker_api.test_training import ADAM, datum, seq_logprob  # noqa: E402
from tinker import types  # noqa: E402

PROMPT = types.ModelInput.from_ints([1, 17, 29, 41, 5])


@pytest.fixture
def training_client(service_client):
    client = service_client()
    return client, client.create_lora_training_client(base_model="tiny", rank=4).result()


def forward_logprobs(tc, tokens: list[int]) -> np.ndarray:
    out = tc.forward([datum(tokens, weights=[1.0] * (len(tokens) - 1))], "cross_entropy").result()
    return out.loss_fn_outputs[0]["logprobs"].to_numpy()


def test_sample_logprobs_equal_forwards_and_prompt_logprobs(training_client) -> None:
    _, tc = training_client
    sc = tc.save_weights_and_get_sampling_client()
    res = sc.sample(PROMPT, num_samples=2, sampling_params=types.SamplingParams(max_tokens=6, temperature=1.0,
                                                                              seed=3)).result()
    assert len(res.sequences) == 2
    for seq in res.sequences:
        assert len(seq.tokens) == len(seq.logprobs) >= 1
        full = PROMPT.to_ints() + list(seq.tokens)
        fwd = forward_logprobs(tc, full)[len(PROMPT.to_ints()) - 1:]
        np.testing.assert_allclose(seq.logprobs, fwd, atol=1e-3)
    plp = sc.compute_logprobs(PROMPT).result()
    assert plp[0] is None and len(plp) == PROMPT.length
    np.testing.assert_allclose(plp[1:], forward_logprobs(tc, PROMPT.to_ints()), atol=1e-3)


def test_a_seed_reproduces_and_stop_ids_end_with_stop(training_client) -> None:
    _, tc = training_client
    sc = tc.save_weights_and_get_sampling_client()
    params = types.SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, top_k=50, seed=11)
    a = sc.sample(PROMPT, 1, params).result().sequences[0]
    b = sc.sample(PROMPT, 1, params).result().sequences[0]
    assert a.tokens == b.tokens and a.stop_reason == "length"
    stop_on = a.tokens[2]
    c = sc.sample(PROMPT, 1, types.SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, top_k=50, seed=11,
                                                  stop=[stop_on])).result().sequences[0]
    assert c.stop_reason == "stop" and c.tokens[-1] == stop_on and len(c.tokens) <= 3


def test_a_snapshot_keeps_its_weights_after_later_steps(training_client) -> None:
    _, tc = training_client
    tokens = [2, 4, 6, 8, 10, 12]
    sc = tc.save_weights_and_get_sampling_client()
    snap = sc.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    for _ in range(3):
        tc.forward_backward([datum(tokens, weights=[1.0] * 5)], "cross_entropy").result()
        tc.optim_step(ADAM).result()
    assert seq_logprob(tc, tokens) > sum(snap[1:]) + 1e-3  # the client moved
    again = sc.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    np.testing.assert_allclose(again[1:], snap[1:], atol=1e-5)  # its snapshot did not


def test_named_sampler_path_and_base_model_sampling(training_client) -> None:
    client, tc = training_client
    path = tc.save_weights_for_sampler("first").result().path
    assert path.startswith("tinker://")
    by_path = client.create_sampling_client(model_path=path)
    base = client.create_sampling_client(base_model="tiny")
    for sc in (by_path, base):
        assert len(sc.sample(PROMPT, 1, types.SamplingParams(max_tokens=3)).result().sequences[0].tokens) >= 1
    with pytest.raises(Exception, match="unknown sampler path"):
        client.create_sampling_client(model_path="tinker://nope/sampler_weights/x").sample(
            PROMPT, 1, types.SamplingParams(max_tokens=3)).result()


def test_topk_sample_logprobs_and_topk_prompt_logprobs(training_client) -> None:
    _, tc = training_client
    sc = tc.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=5, temperature=1.0, seed=4)
    plain = sc.sample(PROMPT, 1, params).result().sequences[0]
    seq = sc.sample(PROMPT, 1, params, topk_sample_logprobs=3).result().sequences[0]
    assert seq.tokens == plain.tokens and plain.topk_logprobs is None
    assert seq.topk_logprobs is not None and len(seq.topk_logprobs) == len(seq.tokens)
    for row, tok, lp in zip(seq.topk_logprobs, seq.tokens, seq.logprobs, strict=True):
        assert row is not None and len(row) == 3
        lps = [x for _, x in row]
        assert lps == sorted(lps, reverse=True) and lp <= lps[0] + 1e-4
        assert tok not in [t for t, _ in row] or dict(row)[tok] == pytest.approx(lp, abs=1e-3)
    # top-k prompt logprobs (the distillation recipes ask for them): none at position 0, k at every other, and the
    # prompt's own token, where it is among them, at its prompt logprob
    out = sc.sample(PROMPT, 1, params, include_prompt_logprobs=True, topk_prompt_logprobs=4).result()
    rows, plp = out.topk_prompt_logprobs, out.prompt_logprobs
    assert rows is not None and plp is not None and len(rows) == len(plp) == len(PROMPT.to_ints())
    assert rows[0] is None
    for tok, row, lp in zip(PROMPT.to_ints()[1:], rows[1:], plp[1:], strict=True):
        assert row is not None and len(row) == 4
        lps = [x for _, x in row]
        assert lps == sorted(lps, reverse=True) and lp <= lps[0] + 1e-4
        if tok in dict(row):
            assert dict(row)[tok] == pytest.approx(lp, abs=1e-3)
        assert sum(math.exp(x) for x in lps) <= 1 + 1e-4 and len(dict(row)) == 4  # 4 distinct tokens
    with pytest.raises(Exception, match="topk_prompt_logprobs must be in 0..20"):
        sc.sample(PROMPT, 1, params, topk_prompt_logprobs=50).result()
