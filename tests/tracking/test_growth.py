"""Tracking work per call grows with the call's prompt, not with the square of the turns (issue 36, build item 4).

Before, each token-in/token-out request re-rendered every prefix of the conversation and re-indexed every
earlier call, and the merge compared every call with every later one. Now a segmentation resumes from the one
before it, the episode's ``TitoSession`` indexes each call once, and at the token level the merge takes the
successors it can infer (the relation is transitive). Counted here, never timed; and the results must equal
the ones computed without any of it.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from episode_sim import EXTRA_TOOL, TOOLS, Sim
from templates import CHATML_SPECIAL, MISTRAL_BOS, MISTRAL_SPECIAL, MISTRAL_TOOLS, with_template

from agentjet.tracking import TrackingConfig, segment, timeline, track_episode
from agentjet.tracking.drift import GenerationIndex, TitoSession, tito_prompt_ids
from agentjet.tracking.segment import Segmentation, segment_messages

# ChatML that shows the reasoning of the last message only (Qwen3 style): a later turn re-renders an earlier one
LAST_THINK = (
    "{%- for message in messages %}"
    "{%- set content = message['content'] or '' %}"
    "{%- if message['role'] == 'assistant' and not loop.last and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1] %}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# ChatML that cannot render a conversation of exactly three messages: a prefix that does not render
NO_THREE = (
    "{%- if messages | length == 3 %}{{- raise_exception('three') }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def tokenizer(base: Any, name: str, toks: dict[str, Any]) -> Any:
    if name in toks:
        return toks[name]
    template, special, bos = {"mistral": (MISTRAL_TOOLS, MISTRAL_SPECIAL, MISTRAL_BOS),
                              "last_think": (LAST_THINK, CHATML_SPECIAL, None),
                              "no_three": (NO_THREE, CHATML_SPECIAL, None)}[name]
    return with_template(base, template, special, bos)


def turn(i: int) -> list[dict[str, Any]]:
    """One agent turn: a reply (with reasoning, or a tool call and its result) and what answers it."""
    if i % 2:
        call_id = f"call{i:05d}"  # 9 characters: the Mistral template refuses others
        return [{"role": "assistant", "content": f"let me look {i}", "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "add", "arguments": '{"x": 1}'}}]},
                {"role": "tool", "tool_call_id": call_id, "content": f"result {i}"}]
    return [{"role": "assistant", "content": f"<think>step {i}</think>answer {i}"},
            {"role": "user", "content": f"and then {i}?"}]


def conversations(turns: int) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    """The requests of a growing conversation, with a fork, an edited earlier message and a tools change."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "go"}]
    tools: list[dict[str, Any]] | None = copy.deepcopy(TOOLS)
    out = []
    for i in range(turns):
        out.append((copy.deepcopy(msgs), copy.deepcopy(tools)))
        msgs = msgs + turn(i)
        if i == turns // 3:
            msgs = msgs[:4]  # a fork: back to an earlier turn
        if i == turns // 2:
            msgs[1] = {"role": "user", "content": "go, edited"}
        if i == 2 * turns // 3:
            tools = (tools or []) + [EXTRA_TOOL]
    return out


def fields(seg: Segmentation) -> dict[str, Any]:
    return {f.name: getattr(seg, f.name) for f in dataclasses.fields(seg)}


@pytest.mark.parametrize("name", ["chatml", "llama3", "gemma", "chatml_strip_thinking", "mistral", "last_think",
                                  "no_three"])
def test_a_resumed_segmentation_equals_a_fresh_one(tiny_base, toks, name):
    tok = tokenizer(tiny_base, name, toks)
    prev = None
    for msgs, tools in conversations(12):
        fresh = segment_messages(tok, msgs, tools)
        resumed = segment_messages(tok, msgs, tools, resume=prev)
        assert fields(resumed) == fields(fresh)
        prev = resumed
    other = tokenizer(tiny_base, "llama3", toks)  # a segmentation by another tokenizer is never reused
    assert fields(segment_messages(other, msgs, tools, resume=prev)) == fields(segment_messages(other, msgs, tools))


class CountRenders:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        real = segment._try_render

        def counted(*args: Any) -> str | None:
            self.n += 1
            return real(*args)

        monkeypatch.setattr(segment, "_try_render", counted)

    def during(self, fn: Any, *args: Any, **kw: Any) -> int:
        before = self.n
        fn(*args, **kw)
        return self.n - before


def growing(turns: int) -> list[list[dict[str, Any]]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "go"}]
    out = []
    for i in range(turns):
        out.append(msgs)
        msgs = msgs + turn(i)
    return out


def test_a_resumed_segmentation_renders_only_the_new_messages(toks, monkeypatch):
    tok = toks["chatml"]
    renders = CountRenders(monkeypatch)
    for turns in (5, 40):
        convs = growing(turns)
        prev = segment_messages(tok, convs[-2], TOOLS)
        fresh = renders.during(segment_messages, tok, convs[-1], TOOLS)
        resumed = renders.during(segment_messages, tok, convs[-1], TOOLS, resume=prev)
        assert fresh == len(convs[-1]) + 1  # every prefix, the full render and the one without generation prompt
        assert resumed == 3  # the full render, the one without generation prompt, the one new prefix


def drifted_episode(tok: Any, name: str, turns: int) -> Sim:
    sim = Sim(tok, name)
    st = sim.new_agent("A")
    for i in range(turns):
        sim.turn(st, tool_calls=i % 2, drift=True)
    return sim


def test_a_tito_session_indexes_each_call_once_and_renders_only_the_new_messages(toks, monkeypatch):
    tok = toks["chatml"]
    calls = drifted_episode(tok, "chatml", 16).calls
    added: list[int] = []
    real_add = GenerationIndex.add

    def add(self: GenerationIndex, call: Any, keys: Any = None) -> None:
        added.append(call.call_index)
        real_add(self, call, keys)

    monkeypatch.setattr(GenerationIndex, "add", add)
    renders = CountRenders(monkeypatch)
    session = TitoSession(tok)
    for t, c in enumerate(calls):
        fresh, fresh_rep = tito_prompt_ids(tok, c.messages, c.tools, c.agent, calls[:t])
        added.clear()
        n = renders.during(tito_prompt_ids, tok, c.messages, c.tools, c.agent, calls[:t], session=session)
        got, rep = tito_prompt_ids(tok, c.messages, c.tools, c.agent, calls[:t], session=session)
        assert (got, rep.drift_repaired, rep.statuses) == (fresh, fresh_rep.drift_repaired, fresh_rep.statuses)
        assert added == ([t - 1] if t else [])  # only the call made since the last request
        assert n <= (3 if t else 2 + len(c.messages))  # after the first request: full, without gen prompt, new
    # a list that is not the server's (another episode's calls): the fresh index, the same result
    other = drifted_episode(tok, "chatml", 3).calls
    c = other[-1]
    assert tito_prompt_ids(tok, c.messages, c.tools, c.agent, other[:-1], session=session)[0] == \
        tito_prompt_ids(tok, c.messages, c.tools, c.agent, other[:-1])[0]


def test_merging_a_linear_episode_compares_each_call_once(toks, monkeypatch):
    tok = toks["chatml"]
    turns = 24
    calls = drifted_episode(tok, "chatml", turns).calls
    compared = []
    real = timeline._Merger.relation

    def relation(self: Any, a: Any, b: Any) -> str | None:
        compared.append((a.index, b.index))
        return real(self, a, b)

    monkeypatch.setattr(timeline._Merger, "relation", relation)
    samples, report = track_episode(calls, tok, TrackingConfig())
    assert len(samples) == 1 and report.merged_calls == turns - 1
    assert sorted(compared) == [(i, i + 1) for i in range(turns - 1)]  # not every pair: (turns - 1) * turns / 2
    compared.clear()
    text, _ = track_episode(calls, tok, TrackingConfig(compare_level="text"))  # not transitive: every pair
    assert len(text) == 1 and len(compared) >= turns * (turns - 1) // 2


def test_a_tracked_episode_resumes_each_segmentation_from_the_one_before(toks, monkeypatch):
    tok = toks["chatml"]
    renders = CountRenders(monkeypatch)
    for turns in (6, 24):
        calls = drifted_episode(tok, "chatml", turns).calls
        n = renders.during(track_episode, calls, tok, TrackingConfig())
        assert n <= 3 * turns + len(calls[0].messages)  # per call: full, without gen prompt, the new prefix
