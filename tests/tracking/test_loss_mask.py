from __future__ import annotations

import json

import pytest
from episode_sim import Sim, check_samples
from templates import TEMPLATES

from agentjet.engines.base import TrainSample
from agentjet.runtime.blocking import run_blocking
from agentjet.tracking import TrackingConfig, episode_weights, sample_trace, track_episode


def episode(tok, name, agents=("A",), turns=4):
    sim = Sim(tok, name)
    states = [sim.new_agent(a) for a in agents]
    for t in range(turns):
        for st in states:
            sim.turn(st, tool_calls=int(t % 2 == 0 and name != "gemma"), drift=t == 1)
    return sim


@pytest.mark.parametrize("name", ["chatml", "llama3", "gemma"])
def test_loss_mask_by_message(toks, name):
    """Mask 1 only on generated tokens; prompt, tool, environment and template tokens are 0; the end-of-turn
    token the model generated is trained, the one the template adds after a user / tool message is not."""
    tok = toks[name]
    sim = episode(tok, name)
    samples, _ = track_episode(sim.calls, tok)
    check_samples(sim, samples)
    eot = tok.convert_tokens_to_ids(TEMPLATES[name][3])
    header = tok.encode(sim.header, add_special_tokens=False)
    (s,) = samples
    gen_spans = [(sp["gen_start"], sp["gen_end"]) for sp in s.stats["call_spans"]]
    for m in s.stats["messages"]:
        lo, hi = m["start"], m["end"]
        if m["role"] != "assistant":
            assert sum(s.loss_mask[lo:hi]) == 0, m
            continue
        # an assistant message of the history = header (not trained) + generated region (trained) + separator
        g0, g1 = next((a, b) for a, b in gen_spans if lo <= a < hi)
        assert s.input_ids[lo:g0] == header and sum(s.loss_mask[lo:g0]) == 0
        assert all(s.loss_mask[g0:g1]) and s.input_ids[g1 - 1] == eot
        assert sum(s.loss_mask[g1:hi]) == 0
    lo, hi = s.stats["generation_prompt"]
    assert sum(s.loss_mask[lo:hi]) == 0 and s.input_ids[lo:hi] == header
    assert s.input_ids[-1] == eot and s.loss_mask[-1] == 1  # the last call's end-of-turn token
    n_eot_trained = sum(1 for i, m in zip(s.input_ids, s.loss_mask, strict=True) if i == eot and m)
    assert n_eot_trained == len(sim.calls)
    assert sum(1 for i in s.input_ids if i == eot) > n_eot_trained  # user / tool turns end with eot too


def test_episode_weights(toks):
    tok = toks["chatml"]
    sim = episode(tok, "chatml", agents=("A", "B"))
    merged, _ = track_episode(sim.calls, tok)
    unmerged, _ = track_episode(sim.calls, tok, TrackingConfig(merge=False))
    assert len(merged) == 2 and len(unmerged) == 8
    for samples in (merged, unmerged):
        w = episode_weights(samples)  # default: per_episode
        assert [s.weight for s in samples] == w
        assert sum(wi * sum(s.loss_mask) for wi, s in zip(w, samples, strict=True)) == pytest.approx(1.0)
        assert episode_weights(samples, "none") == [1.0] * len(samples)
        assert sum(episode_weights(samples, "per_sample")) == pytest.approx(1.0)
    # every trained token weighs the same with merging on or off
    assert merged[0].weight == unmerged[0].weight
    with pytest.raises(ValueError):
        episode_weights(merged, "bogus")
    with pytest.raises(ValueError):
        TrackingConfig(weighting="bogus")
    assert episode_weights([]) == []


def test_sample_trace_is_json_ready(toks):
    tok = toks["chatml"]
    sim = episode(tok, "chatml", turns=3)
    samples, _ = track_episode(sim.calls, tok)
    tr = sample_trace(samples[0], tok)
    json.dumps(tr)
    n = len(samples[0].input_ids)
    assert len(tr["pieces"]) == len(tr["loss_mask"]) == len(tr["logprobs"]) == len(tr["token_call"]) == n
    assert "".join(tr["pieces"]) == tok.decode(samples[0].input_ids, skip_special_tokens=False)
    assert [c["call_index"] for c in tr["calls"]] == samples[0].call_indices
    for c in tr["calls"]:
        a, b = c["generated"]
        assert all(tr["token_call"][i] == c["call_index"] for i in range(a, b))
    assert tr["stats"]["num_calls"] == 3 and tr["agent"] == "A"
    assert [m["role"] for m in tr["messages"]][:2] == ["system", "user"]


def test_merged_and_unmerged_samples_score_the_same(toks, tiny_engine):
    """End to end with the tiny model: every generated token gets the same current-policy logprob whether its
    call is trained alone or inside a merged sample (it sees the very same context)."""
    tok = toks["chatml"]
    sim = episode(tok, "chatml", turns=2)
    merged, _ = track_episode(sim.calls, tok)
    unmerged, _ = track_episode(sim.calls, tok, TrackingConfig(merge=False))
    assert len(merged) == 1 and len(unmerged) == 2

    def train_samples(samples):
        return [TrainSample(s.input_ids, s.loss_mask, s.behaviour_logprobs, [1.0] * len(s.input_ids),
                            s.temperature, s.weight) for s in samples]

    lp_merged = [x for row in run_blocking(tiny_engine.learner.score(train_samples(merged))) for x in row]
    lp_unmerged = [x for row in run_blocking(tiny_engine.learner.score(train_samples(unmerged))) for x in row]
    assert len(lp_merged) == len(lp_unmerged) == sum(len(c.completion_ids) for c in sim.calls)
    assert lp_merged == pytest.approx(lp_unmerged, abs=2e-4)
