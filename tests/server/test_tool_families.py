"""Tool calls in each model family's own format (Hermes, Llama 3.x JSON, Mistral), on the tiny tokenizer with
fixture templates written from each family's documented rendering (tests/tracking/templates.py):

- the parser is found from the chat template;
- a reply in the template's own rendering parses to tool calls that re-render to the same token ids, so a tool
  loop merges into one sample, streamed and unstreamed, with the generated ids trained exactly;
- a reply written unlike the template (other key order, other spacing) still parses; the re-render differs, so
  the next prompt holds what the template rendered, and every trained id is still exactly a generated one.
"""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import dataclass
from typing import Any

import pytest
from tests.tracking.templates import (
    CHATML_EOT,
    CHATML_SPECIAL,
    CHATML_TOOLS,
    LLAMA3_BOS,
    LLAMA3_EOT,
    LLAMA3_SPECIAL,
    LLAMA3_TOOLS,
    MISTRAL_BOS,
    MISTRAL_EOT,
    MISTRAL_SPECIAL,
    MISTRAL_TOOLS,
)

from agentjet import SwarmClient
from agentjet.server.episodes.chat import ChatFormatter, normalize_messages
from agentjet.settings import ToolParserKind

TOOLS = [{"type": "function", "function": {"name": "add", "description": "add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]


@dataclass(frozen=True)
class Family:
    template: str
    special: list[str]
    bos: str | None
    eot: str
    unlike: str  # a reply with a call to add(a=1, b=2), written unlike the template's own rendering


FAMILIES = {
    # <tool_call> stays an ordinary added token, as in Qwen (kept when a reply is decoded)
    ToolParserKind.HERMES: Family(CHATML_TOOLS, [t for t in CHATML_SPECIAL if "tool_call" not in t], None, CHATML_EOT,
                                  '<tool_call>{"arguments":{"b": 2,"a": 1},  "name":"add"}</tool_call>'),
    ToolParserKind.LLAMA3_JSON: Family(LLAMA3_TOOLS, LLAMA3_SPECIAL, LLAMA3_BOS, LLAMA3_EOT,
                                       '{"parameters":{"a":1,"b":2},"name":"add"}'),
    ToolParserKind.MISTRAL: Family(MISTRAL_TOOLS, MISTRAL_SPECIAL, MISTRAL_BOS, MISTRAL_EOT,
                                   '[TOOL_CALLS][{"id":"Ab3dE6gH9","arguments":{"a":1,"b":2},"name":"add"}]'),
}


@pytest.fixture(scope="module")
def tiny_base():
    from agentjet.models import build_tiny_tokenizer

    return build_tiny_tokenizer()


def family_tokenizer(base: Any, kind: ToolParserKind) -> Any:
    fam = FAMILIES[kind]
    tok = copy.deepcopy(base)
    tok.add_special_tokens({"additional_special_tokens": fam.special})
    if fam.bos:
        tok.bos_token = fam.bos
    tok.eos_token = fam.eot
    tok.chat_template = fam.template
    return tok


def call(name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def render(tok: Any, messages: list[dict[str, Any]], generation: bool) -> str:
    return tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=generation, tokenize=False)


def generated_ids(tok: Any, prompt: list[dict[str, Any]], reply: dict[str, Any]) -> list[int]:
    """The ids a model of this family generates for ``reply``: the template's rendering of it, after the
    generation prompt, up to and including the end-of-turn token. (Rendered as the server renders messages:
    tool-call arguments as objects.)"""
    head, full = render(tok, prompt, True), render(tok, normalize_messages([*prompt, reply]), False)
    assert full.startswith(head)
    region = full[len(head):]
    region = region[: region.index(tok.eos_token)]
    return tok.encode(region, add_special_tokens=False) + [tok.eos_token_id]


def full_ids(tok: Any, messages: list[dict[str, Any]]) -> list[int]:
    return tok.encode(render(tok, messages, False), add_special_tokens=False)


USER = [{"role": "user", "content": "add 1 and 2, then 3 and 4"}]


@pytest.mark.parametrize("kind", list(FAMILIES), ids=str)
@pytest.mark.parametrize("n_calls", [1, 2])
def test_each_family_parses_and_re_renders_to_the_same_ids(tiny_base, kind: ToolParserKind, n_calls: int) -> None:
    tok = family_tokenizer(tiny_base, kind)
    fmt = ChatFormatter(tok)
    assert fmt.tool_parser.kind is kind  # found from the chat template
    calls = [call("add", {"a": 1, "b": 2}, "Xy7call01"), call("add", {"a": 3, "b": 4}, "Xy7call02")][:n_calls]
    reply = {"role": "assistant", "content": None, "tool_calls": calls}
    ids = generated_ids(tok, USER, reply)
    text = tok.decode(ids, skip_special_tokens=True)
    content, parsed = fmt.parse_reply(text, ids, tools_given=True)
    assert parsed is not None and content == ""
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed] == \
           [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})][:n_calls]
    if kind is ToolParserKind.MISTRAL:
        assert [c["id"] for c in parsed] == ["Xy7call01", "Xy7call02"][:n_calls]  # the model's own ids, kept
    message = normalize_messages([{"role": "assistant", "content": content or None, "tool_calls": parsed}])[0]
    prompt = fmt.prompt_ids(normalize_messages(USER), TOOLS)
    re_rendered = full_ids(tok, [*USER, fmt.render_messages([message], None)[0]])
    assert re_rendered[: len(prompt) + len(ids)] == prompt + ids  # the reply re-renders to the generated ids


@pytest.mark.parametrize("kind", list(FAMILIES), ids=str)
def test_plain_text_and_broken_calls_stay_text(tiny_base, kind: ToolParserKind) -> None:
    fmt = ChatFormatter(family_tokenizer(tiny_base, kind))
    broken = {ToolParserKind.HERMES: '<tool_call>{"name": "add", "arguments": {"a": </tool_call>',
              ToolParserKind.LLAMA3_JSON: '{"name": "add", "parameters": {"a": 1}} and more words',
              ToolParserKind.MISTRAL: '[TOOL_CALLS] [{"arguments": {"a": 1}}]'}[kind]
    for text in ("The answer is 3.", broken, '{"name": "Ada", "age": 36}'):
        ids = fmt.tokenizer.encode(text, add_special_tokens=False)
        assert fmt.parse_reply(fmt.tokenizer.decode(ids, skip_special_tokens=True), ids, True) == \
               (fmt.tokenizer.decode(ids, skip_special_tokens=True), None)
    assert fmt.parse_reply('{"name": "add", "parameters": {}}', [], tools_given=False)[1] is None


def test_the_setting_overrides_the_template(tiny_base) -> None:
    tok = family_tokenizer(tiny_base, ToolParserKind.HERMES)
    assert ChatFormatter(tok, ToolParserKind.LLAMA3_JSON).tool_parser.kind is ToolParserKind.LLAMA3_JSON
    calls = ChatFormatter(tok, ToolParserKind.LLAMA3_JSON).parse_reply(
        '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; {"name": "add", "arguments": {"a": 2}}', [], True)[1]
    assert [json.loads(c["function"]["arguments"]) for c in calls or []] == [{"a": 1}, {"a": 2}]


def test_mistral_ids_are_nine_characters_when_the_model_wrote_none(tiny_base) -> None:
    fmt = ChatFormatter(family_tokenizer(tiny_base, ToolParserKind.MISTRAL))
    ids = fmt.tokenizer.encode('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}, "id": "bad"}]',
                               add_special_tokens=False)
    _, calls = fmt.parse_reply("", ids, True)
    assert calls and len(calls[0]["id"]) == 9 and calls[0]["id"].isalnum()


# ---------------------------------------------------------------- through the server


async def tool_loop(url: str, turns: int, stream: bool) -> str:
    """An agent that calls the tool, sends back the result, ``turns`` times (the client sends the assistant
    message as the OpenAI SDK gives it back)."""
    async with SwarmClient(url) as client, client.episode(task_id="tools") as ep:
        oa = ep.openai()
        messages: list[dict[str, Any]] = list(USER)
        for i in range(turns):
            if stream:
                calls: dict[int, dict[str, Any]] = {}
                content = ""
                async for chunk in await oa.chat.completions.create(model="x", messages=messages, tools=TOOLS,
                                                                    stream=True):
                    delta = chunk.choices[0].delta if chunk.choices else None
                    content += (delta.content or "") if delta else ""
                    for tc in (delta.tool_calls or []) if delta else []:
                        calls[tc.index] = {"id": tc.id, "type": "function", "function": {
                            "name": tc.function.name, "arguments": tc.function.arguments}}
                msg: dict[str, Any] = {"role": "assistant", "content": content or None,
                                       "tool_calls": [calls[k] for k in sorted(calls)]}
            else:
                r = await oa.chat.completions.create(model="x", messages=messages, tools=TOOLS)
                msg = r.choices[0].message.model_dump(exclude_none=True)
            assert msg["tool_calls"], msg
            messages += [msg, *({"role": "tool", "tool_call_id": tc["id"], "content": str(3 + i)}
                                for tc in msg["tool_calls"])]
        ep.reward(1.0)
        return ep.episode_id


def trained_runs(sample: Any) -> list[list[int]]:
    """The runs of consecutive trained ids of a sample."""
    runs: list[list[int]] = []
    for t, (tid, m) in enumerate(zip(sample.input_ids, sample.loss_mask, strict=True)):
        if m and (t == 0 or not sample.loss_mask[t - 1]):
            runs.append([])
        if m:
            runs[-1].append(tid)
    return runs


def serve_family(make_server, tiny_base, kind: ToolParserKind, reply_ids: list[int] | None = None,
                 reply: dict[str, Any] | None = None):
    from agentjet.layouts.null import null_engine

    tok = family_tokenizer(tiny_base, kind)
    if reply_ids is None:
        reply_ids = generated_ids(tok, USER, reply or {})[:-1]
    engine = null_engine(tok, reply_ids=reply_ids)
    return make_server(engine), engine, reply_ids + [tok.eos_token_id]


@pytest.mark.parametrize("kind", list(FAMILIES), ids=str)
@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_a_tool_loop_in_the_family_format_merges_exactly(make_server, tiny_base, kind: ToolParserKind,
                                                         stream: bool) -> None:
    reply = {"role": "assistant", "content": None, "tool_calls": [call("add", {"a": 1, "b": 2}, "Q1w2E3r4T")]}
    srv, engine, generated = serve_family(make_server, tiny_base, kind, reply=reply)
    eid = asyncio.run(tool_loop(srv.url, 3, stream))
    report = srv.server.store.tracking_report(eid)
    assert report["retokenize_failures"] == 0 and report["drift_mismatches"] == 0
    assert report["samples"] == 1 and report["merged_calls"] == 2, report  # the re-render is the generated ids
    (sample,) = srv.server.store.samples_for([eid])[eid]
    assert trained_runs(sample) == [generated] * 3  # each call's generated ids, exactly, and nothing else
    prompts = list(engine.generator.prompts)[-3:]
    for p in prompts:
        assert sample.input_ids[: len(p)] == p  # every call's prompt is a prefix of the one merged sample


@pytest.mark.parametrize("kind", list(FAMILIES), ids=str)
def test_a_reply_written_unlike_the_template_keeps_the_trained_ids_exact(make_server, tiny_base,
                                                                         kind: ToolParserKind) -> None:
    """Other key order and spacing than the template renders: the call parses; resent, it renders the
    template's way (what the model then sees), so the calls do not merge, and each sample trains exactly the
    ids the model generated, on exactly the prompt it was given."""
    tok = family_tokenizer(tiny_base, kind)
    srv, engine, generated = serve_family(make_server, tiny_base, kind,
                                          reply_ids=tok.encode(FAMILIES[kind].unlike, add_special_tokens=False))
    eid = asyncio.run(tool_loop(srv.url, 2, stream=False))
    first, second = list(engine.generator.prompts)[-2:]
    assert second[: len(first)] == first and second[len(first): len(first) + len(generated)] != generated
    samples = srv.server.store.samples_for([eid])[eid]
    assert len(samples) == 2
    for sample, prompt in zip(samples, (first, second), strict=True):
        assert sample.input_ids == prompt + generated  # the prompt as given, the reply as generated
        assert trained_runs(sample) == [generated]
        assert sample.loss_mask[: len(prompt)] == [0] * len(prompt)
    report = srv.server.store.tracking_report(eid)
    assert report["retokenize_failures"] == 0 and report["samples"] == 2
