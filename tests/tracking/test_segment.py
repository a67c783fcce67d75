from __future__ import annotations

import copy

import pytest
from episode_sim import TOOLS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from templates import HEADERS, TEMPLATES

from agentjet.models import CHATML_TEMPLATE
from agentjet.tracking import segment_messages
from agentjet.tracking.segment import common_prefix_len

CONV = [
    {"role": "system", "content": "you are a tool user"},
    {"role": "user", "content": "what is the weather in paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "paris weather"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny 20"},
    {"role": "assistant", "content": "it is sunny"},
    {"role": "user", "content": "thanks"},
]


def check_partition(tok, seg, messages, tools):
    ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert seg.ids == list(ids)
    spans = seg.spans
    assert spans[0].char_start == 0 and spans[0].token_start == 0
    assert spans[-1].char_end == len(seg.text) and spans[-1].token_end == len(seg.ids)
    for a, b in zip(spans, spans[1:], strict=False):
        assert a.char_end == b.char_start and a.token_end == b.token_start
    assert seg.straddles == []
    for sp in spans:  # token spans cover exactly the character spans
        assert tok.decode(seg.ids[sp.token_start:sp.token_end], skip_special_tokens=False,
                          clean_up_tokenization_spaces=False) == seg.piece(sp)
    assert [sp.role for sp in seg.messages] == [m["role"] for m in messages]


@pytest.mark.parametrize("name", ["chatml", "llama3", "gemma"])
def test_segments_three_templates_with_tools(toks, name):
    tok = toks[name]
    seg = segment_messages(tok, CONV, TOOLS)
    check_partition(tok, seg, CONV, TOOLS)
    assert seg.exact
    assert seg.header == HEADERS[name]  # derived from the template, not hard-coded
    eot = TEMPLATES[name][3]
    for sp in seg.messages:
        piece = seg.piece(sp)
        if CONV[sp.index]["role"] == "assistant":
            assert piece.startswith(seg.header)  # the role header belongs to the message ...
            assert eot in piece  # ... and so does its end-of-turn token
        if sp.content_span is not None:
            a, b = sp.content_span
            assert seg.text[a:b] == CONV[sp.index]["content"].strip()
    tools_text = '"name": "search"'
    if name == "gemma":  # no system role: system prompt and tools are folded into the first user turn
        assert seg.messages[0].char_len < 10
        assert tools_text in seg.piece(seg.messages[1])
        a, _ = seg.messages[0].content_span
        assert seg.messages[1].char_start <= a < seg.messages[1].char_end
    else:
        assert tools_text in seg.piece(seg.messages[0])
    # the assistant tool call and the tool result each get their own span
    assert '"paris weather"' in seg.piece(seg.messages[2])
    assert "sunny 20" in seg.piece(seg.messages[3])


def test_grouped_tool_results_get_separate_spans(toks):
    """ChatML groups consecutive tool results in ONE user turn: the spans still separate them."""
    tok = toks["chatml"]
    msgs = CONV[:2] + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "add", "arguments": '{"x": 1, "y": 2}'}},
            {"id": "b", "type": "function", "function": {"name": "add", "arguments": '{"x": 3, "y": 4}'}}]},
        {"role": "tool", "tool_call_id": "a", "content": "3"},
        {"role": "tool", "tool_call_id": "b", "content": "7"},
    ]
    seg = segment_messages(tok, msgs, TOOLS)
    check_partition(tok, seg, msgs, TOOLS)
    first, second = seg.piece(seg.messages[3]), seg.piece(seg.messages[4])
    assert first.startswith("<|im_start|>user") and "3" in first and "<|im_end|>" not in first
    assert second.startswith("\n<tool_response>") and second.endswith("<|im_end|>\n")


def test_segments_project_chatml_template_and_no_generation_prompt(tiny_base):
    tok = copy.deepcopy(tiny_base)
    tok.chat_template = CHATML_TEMPLATE
    seg = segment_messages(tok, CONV, None, add_generation_prompt=False)
    assert seg.generation is None and seg.header == ""
    assert seg.messages[-1].char_end == len(seg.text)
    seg = segment_messages(tok, CONV, None)
    check_partition(tok, seg, CONV, None)


def test_template_that_rerenders_earlier_turns_is_flagged(toks):
    """A template that drops the reasoning of assistant turns still segments; the spans hold what is rendered."""
    tok = toks["chatml_strip_thinking"]
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>hmm</think>\nhello"},
            {"role": "user", "content": "bye"}]
    seg = segment_messages(tok, msgs, None)
    check_partition(tok, seg, msgs, None)
    assert "hmm" not in seg.piece(seg.messages[1]) and "hello" in seg.piece(seg.messages[1])


def test_common_prefix_len():
    assert common_prefix_len("abcdef", "abcxyz") == 3
    assert common_prefix_len("abc", "abcdef") == 3
    assert common_prefix_len("", "abc") == 0
    assert common_prefix_len("x" * 1000 + "a", "x" * 1000 + "b") == 1000


@st.composite
def conversations(draw, alternate: bool):
    msgs = [{"role": "system", "content": draw(st.sampled_from(["be brief", "you are a tool user", "sys  x"]))}]
    n = draw(st.integers(1, 6))
    words = st.lists(st.sampled_from(["the", "answer", "is", "42", " ", "\n", "ok", "{", '"x"', "é"]),
                     min_size=1, max_size=6).map(lambda w: "".join(w).strip() or "ok")
    for i in range(n):
        msgs.append({"role": "user", "content": draw(words)})
        if i < n - 1 or draw(st.booleans()):
            if not alternate and draw(st.booleans()):
                msgs.append({"role": "assistant", "content": "", "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": "add", "arguments": '{"x": 1}'}}]})
                msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": draw(words)})
                msgs.append({"role": "assistant", "content": draw(words)})
            else:
                msgs.append({"role": "assistant", "content": draw(words)})
    if msgs[-1]["role"] == "assistant":
        msgs.append({"role": "user", "content": "go on"})
    return msgs


@pytest.mark.parametrize("name", ["chatml", "llama3", "gemma"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_segmentation_property(toks, name, data):
    msgs = data.draw(conversations(alternate=name == "gemma"))
    tools = TOOLS if data.draw(st.booleans()) else None
    tok = toks[name]
    seg = segment_messages(tok, msgs, tools)
    check_partition(tok, seg, msgs, tools)
    assert seg.exact
    for sp in seg.messages:
        if sp.content_span is not None:
            a, b = sp.content_span
            assert seg.text[a:b] in (msgs[sp.index]["content"], msgs[sp.index]["content"].strip())
