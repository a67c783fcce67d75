from __future__ import annotations

import copy

import pytest
from episode_sim import EXTRA_TOOL, Sim, check_samples

from agentjet.models import CHATML_TEMPLATE
from agentjet.tracking import CompareLevel, TrackingConfig, build_samples, track_episode


def by_calls(samples):
    return sorted(s.call_indices for s in samples)


@pytest.mark.parametrize("name", ["chatml", "llama3", "gemma"])
def test_linear_conversation_merges_into_one_sample(toks, name):
    tok = toks[name]
    sim = Sim(tok, name)
    a = sim.new_agent("A")
    for t in range(6):
        sim.turn(a, tool_calls=int(t % 2 == 0), drift=t == 3)
    samples, report = track_episode(sim.calls, tok)
    check_samples(sim, samples)
    assert by_calls(samples) == [[0, 1, 2, 3, 4, 5]]
    assert report.samples == 1 and report.merged_calls == 5 and report.blocked == {}
    assert report.tokens_merged == len(samples[0].input_ids) < report.tokens_unmerged / 3
    assert report.trained_tokens == sum(len(c.completion_ids) for c in sim.calls)


def test_retry_of_the_last_call_keeps_branches_separate(toks):
    tok = toks["chatml"]
    sim = Sim(tok, "chatml")
    a = sim.new_agent("A")
    sim.turn(a, tool_calls=1)
    sim.turn(a)
    saved = copy.deepcopy(a)
    sim.turn(a)  # call 2
    a = saved  # go back to before call 2 and continue differently
    sim.turn(a)  # call 3: the same context as call 2
    sim.turn(a)  # call 4
    samples, report = track_episode(sim.calls, tok)
    check_samples(sim, samples)
    # 0 and 1 are shared by both branches but trained once, in one of them
    assert len(samples) == 2 and report.merged_calls == 3
    assert by_calls(samples) in ([[0, 1, 2], [3, 4]], [[0, 1, 3, 4], [2]])
    assert report.blocked == {"retry": 1}


def test_fork_of_the_history(toks):
    tok = toks["chatml"]
    sim = Sim(tok, "chatml")
    a = sim.new_agent("A")
    sim.turn(a, tool_calls=1)  # 0
    saved = copy.deepcopy(a)
    sim.turn(a)  # 1
    sim.turn(a, tool_calls=2)  # 2
    sim.turn(a)  # 3
    a = saved  # fork back to after call 0
    sim.turn(a)  # 4
    sim.turn(a)  # 5
    samples, report = track_episode(sim.calls, tok)
    check_samples(sim, samples)
    assert len(samples) == 2 and report.merged_calls == 4
    assert by_calls(samples) in ([[0, 1, 2, 3], [4, 5]], [[0, 4, 5], [1, 2, 3]])
    assert report.blocked == {"rewind": 1}


def test_retry_with_edited_context_is_not_merged(toks):
    tok = toks["chatml"]
    sim = Sim(tok, "chatml")
    a = sim.new_agent("A")
    sim.turn(a, tool_calls=1)  # call 0 -> tool result appended
    sim.turn(a)  # call 1 sees the tool result ...
    a.messages, a.origins = a.messages[:-2], a.origins[:-2]  # ... its reply and the feedback are dropped,
    a.messages[-1] = {**a.messages[-1], "content": "error: retry with other arguments"}  # the result edited
    sim.turn(a)  # call 2
    sim.turn(a)  # call 3
    samples, report = track_episode(sim.calls, tok)
    check_samples(sim, samples)
    assert by_calls(samples) in ([[0, 1], [2, 3]], [[0, 2, 3], [1]])
    assert report.blocked == {"edited": 1}


def test_memory_rewrite_and_retry_same_context(toks):
    tok = toks["chatml"]
    sim = Sim(tok, "chatml")
    a = sim.new_agent("A")
    sim.turn(a)  # 0
    sim.call(a, sim.reply())  # 1: a retry whose output is discarded
    sim.turn(a)  # 2
    a.messages[0] = {"role": "system", "content": "memory: the user likes short answers"}  # memory rewrite
    a.origins = [None] * len(a.origins)
    sim.turn(a)  # 3
    sim.turn(a)  # 4
    samples, report = track_episode(sim.calls, tok)
    check_samples(sim, samples)
    assert by_calls(samples) == [[0, 1], [2], [3, 4]] or by_calls(samples) == [[0, 2], [1], [3, 4]]
    assert sum(report.blocked.values()) == 2
    assert report.blocked.get("edited") == 1  # 2 -> 3: the system prompt changed
    assert report.blocked.get("retry") == 1 or report.blocked.get("duplicate") == 1


def test_client_stripping_reasoning_is_not_merged(toks):
    tok = toks["chatml"]
    sim = Sim(tok, "chatml")
    a = sim.new_agent("A")
    sim.turn(a, think=True, strip_think=True)
    sim.turn(a)
    samples, report = track_episode(sim.calls, tok)
    check_samples(sim, samples)
    assert len(samples) == 2 and report.blocked == {"output_edited": 1}


def tools_change_episode(tok, name):
    sim = Sim(tok, name)
    a = sim.new_agent("A")
    sim.turn(a, tool_calls=1, drift=True)
    a.tools = a.tools + [EXTRA_TOOL]  # the agent loads one more tool
    sim.turn(a)
    return sim


def test_tools_change_with_rendered_tools(toks):
    tok = toks["chatml"]  # the tools are in the system prompt: the tokens change
    sim = tools_change_episode(tok, "chatml")
    for ignore in (True, False):
        samples, report = track_episode(sim.calls, tok, TrackingConfig(ignore_tools=ignore))
        check_samples(sim, samples)
        assert len(samples) == 2 and report.blocked == {"tools_changed": 1}
    # TEXT level + ignore_tools: merged; the absorbed call is trained in the new tools' context
    samples, report = track_episode(sim.calls, tok, TrackingConfig(compare_level=CompareLevel.TEXT,
                                                                   ignore_tools=True))
    check_samples(sim, samples, exact_context=False)
    assert by_calls(samples) == [[0, 1]]
    spans = samples[0].stats["call_spans"]
    assert [sp["exact_context"] for sp in spans] == [False, True]
    assert samples[0].input_ids[:spans[1]["gen_start"]] == sim.expected_prompt(sim.calls[1])
    samples, report = track_episode(sim.calls, tok, TrackingConfig(compare_level="text", ignore_tools=False))
    assert len(samples) == 2 and report.blocked == {"tools_changed": 1}


def test_tools_change_with_a_template_that_does_not_render_tools(tiny_base):
    tok = copy.deepcopy(tiny_base)
    tok.chat_template = CHATML_TEMPLATE  # the project's ChatML: tool calls rendered, tools list not
    sim = tools_change_episode(tok, "chatml")
    samples, report = track_episode(sim.calls, tok, TrackingConfig(ignore_tools=True))
    check_samples(sim, samples)
    assert by_calls(samples) == [[0, 1]]
    samples, report = track_episode(sim.calls, tok, TrackingConfig(ignore_tools=False))
    check_samples(sim, samples)
    assert len(samples) == 2 and report.blocked == {"tools_changed": 1}


def test_two_agents_interleaved_never_merge_across(toks):
    tok = toks["chatml"]
    sim = Sim(tok, "chatml")
    a = sim.new_agent("A", system="same system")
    b = sim.new_agent("B", system="same system")
    for t in range(4):
        sim.turn(a, tool_calls=int(t == 1), drift=t == 2)
        sim.turn(b, drift=t == 0)
    # C continues A's conversation as another agent: A's calls are a prefix of C's, but never merged across
    c = copy.deepcopy(a)
    c.name = "C"
    c.origins = [None] * len(c.origins)
    sim.turn(c)
    samples, report = track_episode(sim.calls, tok)
    check_samples(sim, samples)
    assert by_calls(samples) == [[0, 2, 4, 6], [1, 3, 5, 7], [8]]
    assert report.agents == {"A": {"calls": 4, "samples": 1}, "B": {"calls": 4, "samples": 1},
                             "C": {"calls": 1, "samples": 1}}
    c_sample = next(s for s in samples if s.agent == "C")
    assert c_sample.input_ids[:-len(sim.calls[8].completion_ids)] == sim.calls[8].prompt_ids  # nothing spliced


def test_temperature_change_blocks(toks):
    tok = toks["chatml"]
    sim = Sim(tok, "chatml")
    a = sim.new_agent("A")
    sim.turn(a)
    sim.turn(a, temperature=0.7)
    samples, report = track_episode(sim.calls, tok)
    assert len(samples) == 2 and report.blocked == {"temperature": 1}
    assert {s.temperature for s in samples} == {1.0, 0.7}


def test_duplicate_generation_is_trained_once(toks):
    tok = toks["chatml"]
    sim = Sim(tok, "chatml")
    a = sim.new_agent("A")
    sim.turn(a)
    twin = copy.deepcopy(sim.calls[0])  # a retry that produced the very same tokens
    twin.call_index = 1
    sim.calls.append(twin)
    sim.origins_at[1] = sim.origins_at[0]
    sim.turn(a)  # call 2 continues
    samples, report = track_episode(sim.calls, tok)
    check_samples(sim, samples)
    assert len(samples) == 2 and report.blocked == {"duplicate": 1}


def test_merge_off_and_no_tokenizer_keep_one_sample_per_call(toks):
    tok = toks["chatml"]
    sim = Sim(tok, "chatml")
    a = sim.new_agent("A")
    for _ in range(3):
        sim.turn(a, tool_calls=1)
    for samples in (build_samples(sim.calls), build_samples(sim.calls, tok, TrackingConfig(merge=False))):
        check_samples(sim, samples)
        assert by_calls(samples) == [[0], [1], [2]]
        for s, c in zip(samples, sim.calls, strict=True):
            assert s.input_ids == c.prompt_ids + c.completion_ids
            assert s.loss_mask == [0] * len(c.prompt_ids) + [1] * len(c.completion_ids)


def test_text_level_merges_linear_and_respects_drift(toks):
    tok = toks["llama3"]
    sim = Sim(tok, "llama3")
    a = sim.new_agent("A")
    for t in range(4):
        sim.turn(a, tool_calls=int(t == 0), drift=t == 1)
    samples, _ = track_episode(sim.calls, tok, TrackingConfig(compare_level="text"))
    check_samples(sim, samples)
    assert by_calls(samples) == [[0, 1, 2, 3]]
    samples, report = track_episode(sim.calls, tok, TrackingConfig(compare_level="text", fix_drift=False))
    check_samples(sim, samples, fix_drift=False)
    assert by_calls(samples) == [[0, 1], [2, 3]] and report.blocked == {"drift_unrepaired": 1}
