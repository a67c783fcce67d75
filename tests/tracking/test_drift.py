from __future__ import annotations

import copy

import pytest
from episode_sim import Sim, find_sub

from agentjet.tracking import CallRecord, TrackingConfig, build_samples, tito_prompt_ids, track_episode


def drift_episode(tok, name="chatml"):
    """Two calls; the model spelled its first reply as single characters, which re-encoding merges."""
    sim = Sim(tok, name)
    a = sim.new_agent("A")
    first = sim.turn(a, drift=True)
    second = sim.turn(a)
    return sim, first, second


@pytest.mark.parametrize("name", ["chatml", "llama3", "gemma"])
def test_constructed_mismatch_is_detected_and_repaired(toks, name):
    tok = toks[name]
    sim, first, second = drift_episode(tok, name)
    origin = sim.origins_at[second.call_index][2]
    assert origin.generated != origin.canonical  # re-encoding the text merges the characters
    assert tok.decode(origin.generated) == tok.decode(origin.canonical)
    assert find_sub(second.prompt_ids, origin.canonical) >= 0  # the server re-tokenized: drift
    assert find_sub(second.prompt_ids, origin.generated) < 0

    samples, report = track_episode(sim.calls, tok, TrackingConfig(fix_drift=True))
    assert report.drift_mismatches == 1 and report.drift_repaired == 1 and report.drifted_generations == 1
    assert len(samples) == 1 and samples[0].call_indices == [0, 1]
    s = samples[0]
    assert s.stats["drift"] is True and s.stats["drift_found"] == 1 and s.stats["drift_repaired"] == 1
    # the exact generated ids are in the sequence, trained with their logprobs
    n = len(first.prompt_ids)
    assert s.input_ids[:n] == first.prompt_ids
    assert s.input_ids[n:n + len(first.completion_ids)] == first.completion_ids
    assert s.loss_mask[n:n + len(first.completion_ids)] == [1] * len(first.completion_ids)
    assert s.behaviour_logprobs[n:n + len(first.completion_ids)] == first.completion_logprobs
    assert s.input_ids[:s.stats["call_spans"][1]["gen_start"]] == sim.expected_prompt(second)
    assert s.stats["call_spans"][1]["prompt_repaired"] is True


@pytest.mark.parametrize("name", ["chatml", "llama3"])
def test_fix_drift_off_keeps_the_raw_retokenization(toks, name):
    tok = toks[name]
    sim, first, second = drift_episode(tok, name)
    samples, report = track_episode(sim.calls, tok, TrackingConfig(fix_drift=False))
    assert report.drift_mismatches == 1 and report.drift_repaired == 0
    assert len(samples) == 2  # the prefix is broken by the drift: no merge
    assert report.blocked == {"drift_unrepaired": 1}
    by_call = {s.call_indices[0]: s for s in samples}
    for c in sim.calls:  # each sample is exactly the recorded prompt + the generated ids
        assert by_call[c.call_index].input_ids == c.prompt_ids + c.completion_ids
    assert all(s.stats["drift"] for s in samples)
    # merging off but fixing on: one sample per call, with the repaired prompt
    samples = build_samples(sim.calls, tok, TrackingConfig(merge=False, fix_drift=True))
    assert len(samples) == 2
    assert samples[1].input_ids == sim.expected_prompt(second) + second.completion_ids


def test_no_drift_when_generation_is_canonical(toks):
    tok = toks["chatml"]
    sim = Sim(tok, "chatml")
    a = sim.new_agent("A")
    for _ in range(3):
        sim.turn(a, tool_calls=1)
    samples, report = track_episode(sim.calls, tok)
    assert report.drift_mismatches == 0 and len(samples) == 1
    assert samples[0].stats["drift"] is False


def test_truncated_generation_is_spliced(toks):
    """finish_reason=length: no end-of-turn token was generated, the template adds it as a prompt token."""
    tok = toks["chatml"]
    sim = Sim(tok, "chatml")
    a = sim.new_agent("A")
    first = sim.turn(a, truncate=6, words=8)
    second = sim.turn(a)
    assert first.finish_reason == "length"
    samples, report = track_episode(sim.calls, tok)
    assert len(samples) == 1
    s = samples[0]
    n = len(first.prompt_ids)
    assert s.input_ids[n:n + len(first.completion_ids)] == first.completion_ids
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    assert s.input_ids[n + len(first.completion_ids)] == eot  # added by the template ...
    assert s.loss_mask[n + len(first.completion_ids)] == 0  # ... so not trained
    assert s.input_ids[:s.stats["call_spans"][1]["gen_start"]] == sim.expected_prompt(second)


def test_render_mismatch_is_not_drift(toks):
    """A template that strips the reasoning re-renders the reply with another text: not drift, never spliced,
    never merged."""
    tok = toks["chatml_strip_thinking"]
    sim = Sim(tok, "chatml_strip_thinking")
    a = sim.new_agent("A", tools=False)
    sim.turn(a, think=True)
    sim.turn(a)
    samples, report = track_episode(sim.calls, tok)
    assert report.drift_mismatches == 0 and report.render_mismatches == 1
    assert len(samples) == 2 and report.blocked == {"render_mismatch": 1}
    for s in samples:
        c = sim.calls[s.call_indices[0]]
        assert s.input_ids == c.prompt_ids + c.completion_ids


def test_tito_prompt_ids_for_a_new_request(toks):
    """A server can build the next prompt with the generated ids spliced in: then nothing drifts."""
    tok = toks["chatml"]
    sim, first, second = drift_episode(tok)
    ids, info = tito_prompt_ids(tok, second.messages, second.tools, "A", [first])
    assert ids == sim.expected_prompt(second)
    assert info.drift_found == 1 and [r.status for r in info.regions] == ["repaired"]
    # a call recorded with those ids has no drift, and merges
    tito_second = copy.deepcopy(second)
    tito_second.prompt_ids = ids
    samples, report = track_episode([first, tito_second], tok)
    assert report.drift_mismatches == 0 and len(samples) == 1
    assert samples[0].input_ids == ids + second.completion_ids
    # another agent's generations are never spliced
    ids_b, info_b = tito_prompt_ids(tok, second.messages, second.tools, "B", [first])
    assert ids_b == second.prompt_ids and info_b.regions == []


def test_unexplained_recorded_prompt_is_left_alone(toks):
    tok = toks["chatml"]
    sim, first, second = drift_episode(tok)
    odd = copy.deepcopy(second)
    odd.prompt_ids = [tok.convert_tokens_to_ids("<|endoftext|>")] + second.prompt_ids  # e.g. another template
    samples, report = track_episode([first, odd], tok)
    assert report.retokenize_failures == 1 and len(samples) == 2
    odd_sample = next(s for s in samples if s.call_indices == [odd.call_index])
    assert odd_sample.input_ids == odd.prompt_ids + odd.completion_ids
    assert odd_sample.stats["retokenize_mismatch"] is True


def test_mismatched_logprobs_are_rejected(toks):
    c = CallRecord(0, "A", [], None, [1, 2], [3], [], 1.0, 0, {"role": "assistant", "content": ""})
    with pytest.raises(ValueError):
        build_samples([c], toks["chatml"])


def test_resent_reply_with_client_noise_is_still_recognised(toks):
    """Clients resend the reply with extra fields (refusal, annotations) and may renumber tool-call ids: the
    generation is still recognised (the rendered text decides), spliced and merged."""
    tok = toks["chatml"]
    sim = Sim(tok, "chatml")
    a = sim.new_agent("A")
    first = sim.turn(a, tool_calls=1, drift=True)
    sent = a.messages[2]
    a.messages[2] = {**sent, "refusal": None, "annotations": [],
                     "tool_calls": [{**tc, "id": "renumbered"} for tc in sent["tool_calls"]]}
    second = sim.turn(a)
    samples, report = track_episode(sim.calls, tok)
    assert report.drift_repaired == 1 and len(samples) == 1
    assert samples[0].input_ids[:len(first.prompt_ids) + len(first.completion_ids)] == \
        first.prompt_ids + first.completion_ids
    assert samples[0].input_ids[-len(second.completion_ids):] == second.completion_ids
