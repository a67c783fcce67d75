"""Per-token policy versions through context tracking: merged samples concatenate each call's versions on its
generated span (prompt and tool tokens have none), and the trace lists where a version changed inside a reply."""

from __future__ import annotations

from episode_sim import Sim, check_samples

from agentjet.tracking import NO_VERSION, EpisodeSample, build_samples, sample_trace, track_episode


def spanning_episode(tok) -> Sim:
    """Three calls of one agent; call 1's reply spans an update after its third token (v1 -> v2)."""
    sim = Sim(tok, "chatml")
    a = sim.new_agent("A")
    for t in range(3):
        sim.turn(a, tool_calls=int(t == 0))
    c1 = sim.calls[1]
    assert c1.policy_version == 1 and len(c1.completion_ids) > 4
    c1.completion_versions = [1, 1, 1] + [2] * (len(c1.completion_ids) - 3)
    return sim


def test_merged_sample_concatenates_the_versions_of_each_call(toks) -> None:
    tok = toks["chatml"]
    sim = spanning_episode(tok)
    samples, _ = track_episode(sim.calls, tok)
    check_samples(sim, samples)
    assert len(samples) == 1 and samples[0].call_indices == [0, 1, 2]
    s = samples[0]
    want = [NO_VERSION] * len(s.input_ids)
    for span, call in zip(s.stats["call_spans"], sim.calls, strict=True):
        want[span["gen_start"]:span["gen_end"]] = call.versions
    assert s.token_versions == want
    assert want.count(NO_VERSION) > 0  # the prompt, tool results and user turns have no version
    assert {v for v, m in zip(want, s.loss_mask, strict=True) if m} == {0, 1, 2}
    assert all(v != NO_VERSION for v, m in zip(want, s.loss_mask, strict=True) if m)
    assert s.min_policy_version == 0


def test_trace_lists_the_version_change_inside_a_reply_only(toks) -> None:
    tok = toks["chatml"]
    sim = spanning_episode(tok)
    s = build_samples(sim.calls, tok)[0]
    trace = sample_trace(s, tok)
    start = s.stats["call_spans"][1]["gen_start"]
    assert trace["version_changes"] == [{"index": start + 3, "from": 1, "to": 2}]  # not the v0 -> v1 between calls
    assert trace["versions"][start + 2] == 1 and trace["versions"][start + 3] == 2
    assert trace["versions"][0] is None


def test_one_sample_per_call_without_a_tokenizer_keeps_versions(toks) -> None:
    sim = spanning_episode(toks["chatml"])
    samples = build_samples(sim.calls)
    assert [s.versions[len(c.prompt_ids):] for s, c in zip(samples, sim.calls, strict=True)] == [
        c.versions for c in sim.calls]


def test_a_sample_stored_without_versions_counts_its_trained_tokens_at_its_oldest_version() -> None:
    s = EpisodeSample(input_ids=[1, 2, 3, 4], loss_mask=[0, 0, 1, 1], behaviour_logprobs=[0.0, 0.0, -1.0, -1.0],
                      agent="a", temperature=1.0, call_indices=[0], min_policy_version=3)
    assert s.versions == [NO_VERSION, NO_VERSION, 3, 3]
