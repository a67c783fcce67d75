"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` against a live server, through the real, pinned
Anthropic SDK: create, stream, a tool round trip, count_tokens, an over-long prompt, a wrong key; what Claude
Code sends; errors in Anthropic's shape; ``max_tokens`` cut to the room the prompt leaves; a sub-agent with
another system prompt is its own timeline in the episode."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import httpx
import openai
import pytest
from tests.server.harness_helpers import TOOL_RESULT, scripted_engine, tool_call_text, trace
from transformers import AutoTokenizer

from agentjet import SwarmClient

TOOLS = [{"name": "lookup", "description": "look a key up",
          "input_schema": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}]
HI = [{"role": "user", "content": "hi"}]


def client(ep: Any, **kw: Any) -> anthropic.AsyncAnthropic:
    kw = kw or {"api_key": ep.api_key}
    return anthropic.AsyncAnthropic(base_url=ep.anthropic_base_url, max_retries=0, timeout=120, **kw)


@pytest.fixture
def scripted(make_server, tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    replies = [tool_call_text(tok, "lookup", {"key": "a"}), "The value is 7431."]
    return make_server(scripted_engine(tok, replies), admin_token="adm1n")


def test_create_and_stream_are_the_chat_call(make_server) -> None:
    """Greedy, a message is the chat completion of the same messages; the stream's events are Anthropic's and
    its text the message's; count_tokens counts the prompt the call saw."""
    srv = make_server("tiny", admin_token="adm1n")
    system = [{"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}}]

    async def main() -> tuple[Any, ...]:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            chat = await openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key).chat.completions.create(
                model="tiny", messages=[{"role": "system", "content": "Be terse."}, *HI], max_tokens=10, temperature=0)
            an = client(ep)
            greedy = {"temperature": 0}  # (this SDK's create has no temperature parameter: sent as is)
            made = await an.messages.create(model="tiny", system=system, messages=HI, max_tokens=10, extra_body=greedy)
            counted = await an.messages.count_tokens(model="tiny", system=system, messages=HI)
            events = []
            async with an.messages.stream(model="tiny", system=system, messages=HI, max_tokens=10,
                                          extra_body=greedy) as stream:
                async for event in stream:
                    events.append(event)
                final = await stream.get_final_message()
            ep.reward(0.0)
        return chat, made, counted, events, final, ep.episode_id

    chat, made, counted, events, final, eid = asyncio.run(main())
    (block,) = made.content
    assert block.type == "text" and block.text == chat.choices[0].message.content
    assert made.stop_reason == "max_tokens" and made.usage.output_tokens == 10
    assert made.usage.input_tokens == chat.usage.prompt_tokens == counted.input_tokens
    assert made.id.startswith("msg_") and made.role == "assistant" and made.type == "message"
    raw = [e.type for e in events if e.type not in ("text",)]  # "text": the SDK's own convenience events
    assert raw[:3] == ["message_start", "content_block_start", "content_block_delta"]
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].text == block.text and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 10 and final.usage.input_tokens == counted.input_tokens
    apis = [c["api"] for s in trace(srv, eid)["samples"] for c in s["calls"]]
    assert sorted(apis) == ["chat.completions", "messages", "messages"]  # count_tokens records nothing


def test_ping_comes_after_message_start(make_server) -> None:
    srv = make_server("tiny")
    with httpx.Client(base_url=srv.url, timeout=60) as http:
        ep = http.post("/swarm/v1/episodes", json={"client_id": "c", "task_id": "t"}).json()
        r = http.post("/v1/messages", json={"model": "tiny", "messages": HI, "max_tokens": 3, "stream": True},
                      headers={"x-api-key": ep["api_key"]})
    kinds = [line.removeprefix("event: ") for line in r.text.splitlines() if line.startswith("event: ")]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_delta") >= 1 and kinds.count("content_block_start") == 1


def test_a_tool_round_trip_merges_into_one_sample(scripted) -> None:
    srv = scripted

    async def main() -> tuple[Any, ...]:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            an = client(ep)
            ask = [{"role": "user", "content": "what is a?"}]
            first = await an.messages.create(model="tiny", messages=ask, tools=TOOLS, max_tokens=100)
            (use,) = first.content
            second = await an.messages.create(model="tiny", tools=TOOLS, max_tokens=100, messages=[
                *ask, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": TOOL_RESULT}]}])
            async with an.messages.stream(model="tiny", messages=ask, tools=TOOLS, max_tokens=100) as stream:
                streamed = await stream.get_final_message()
            ep.reward(1.0)
        return first, second, streamed, ep.episode_id

    first, second, streamed, eid = asyncio.run(main())
    (use,) = first.content
    assert use.type == "tool_use" and use.name == "lookup" and use.input == {"key": "a"}
    assert first.stop_reason == "tool_use" and second.stop_reason == "end_turn"
    assert second.content[0].text == "The value is 7431."
    assert streamed.stop_reason == "tool_use" and streamed.content[0].input == {"key": "a"}
    samples = trace(srv, eid)["samples"]
    assert sorted(s["call_indices"] for s in samples) == [[0, 1], [2]]


def test_an_over_long_prompt_a_wrong_key_and_images_get_anthropics_errors(make_server) -> None:
    srv = make_server("tiny")

    async def main() -> dict[str, Any]:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            an = client(ep)
            out: dict[str, Any] = {}
            with pytest.raises(anthropic.BadRequestError) as long:
                await an.messages.create(model="tiny", messages=[{"role": "user", "content": "hi " * 5000}],
                                         max_tokens=10)
            out["long"] = long.value
            counted = await an.messages.count_tokens(model="tiny", messages=[{"role": "user", "content": "hi " * 5000}])
            out["counted"] = counted.input_tokens
            with pytest.raises(anthropic.AuthenticationError) as wrong:
                await client(ep, api_key="aj-ep-wrong").messages.create(model="tiny", messages=HI, max_tokens=5)
            out["wrong"] = wrong.value
            image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
            with pytest.raises(anthropic.BadRequestError) as img:
                await an.messages.create(model="tiny", max_tokens=5, messages=[
                    {"role": "user", "content": [image, {"type": "text", "text": "what is this?"}]}])
            out["image"] = img.value
            with pytest.raises(anthropic.NotFoundError) as missing:
                await an.post("/v1/messages/batches", body={}, cast_to=httpx.Response)
            out["missing"] = missing.value
            out["calls"] = len(srv.server.registry.get(ep.episode_id).calls)
            ep.reward(0.0)
        return out

    out = asyncio.run(main())
    assert out["long"].status_code == 400 and out["long"].body["type"] == "error"
    assert out["long"].body["error"]["type"] == "invalid_request_error"
    assert out["long"].body["error"]["message"].startswith("prompt is too long: ")
    assert out["counted"] > 4096  # counting an over-long prompt is no error: that is how a harness measures it
    assert out["wrong"].body == {"type": "error", "error": {"type": "authentication_error",
                                                           "message": "unknown or expired episode key"}}
    assert "images and documents are not supported" in out["image"].body["error"]["message"]
    assert out["missing"].body["error"]["type"] == "not_found_error"
    assert out["calls"] == 0


def test_max_tokens_beyond_the_room_is_cut_to_it(make_server) -> None:
    """Claude Code asks for 32000 on every call: the call generates up to what the context has left, and says
    max_tokens when it stops there (chat keeps its 400 for the same request)."""
    srv = make_server("tiny")
    context = srv.server.engine.max_context

    def filler(k: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": "hi " * k}]

    async def main() -> tuple[Any, ...]:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            an = client(ep)

            async def count(k: int) -> int:
                return (await an.messages.count_tokens(model="tiny", messages=filler(k))).input_tokens

            c100, c200 = await count(100), await count(200)
            per = (c200 - c100) / 100
            k = int((context - 40 - (c100 - 100 * per)) / per)  # a prompt that leaves a few dozen tokens
            room = context - await count(k)
            made = await an.messages.create(model="tiny", messages=filler(k), max_tokens=32000,
                                            extra_body={"temperature": 0})
            with pytest.raises(openai.BadRequestError, match="exceeds the model's context"):
                await openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key).chat.completions.create(
                    model="tiny", messages=filler(k), max_tokens=32000)
            ep.reward(0.0)
        return room, made

    room, made = asyncio.run(main())
    assert 0 < room < 100
    assert made.usage.output_tokens == room and made.stop_reason == "max_tokens"  # greedy: the tiny model runs on


CLAUDE_CODE_LIKE = {
    "model": "tiny", "max_tokens": 32000, "stream": True,
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1"},
               {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
               {"type": "text", "text": "Be careful.", "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "system", "content": "<system-reminder>todo list is empty</system-reminder>"},
                 {"role": "user", "content": [{"type": "text", "text": "what is a?",
                                               "cache_control": {"type": "ephemeral"}}]}],
    "tools": [{**TOOLS[0], "cache_control": {"type": "ephemeral"}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": False},
    "thinking": {"type": "adaptive"}, "context_management": {"edits": []}, "output_config": {"effort": "high"},
    "metadata": {"user_id": "u_1"}, "temperature": 1,
}


def test_what_claude_code_sends_is_served(scripted) -> None:
    srv = scripted
    with httpx.Client(base_url=srv.url, timeout=60) as http:
        ep = http.post("/swarm/v1/episodes", json={"client_id": "c", "task_id": "t"}).json()
        h = {"Authorization": f"Bearer {ep['api_key']}", "anthropic-version": "2023-06-01",
             "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27"}
        r = http.post("/v1/messages?beta=true", json=CLAUDE_CODE_LIKE, headers=h)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
        assert '"stop_reason": "tool_use"' in r.text and "event: message_stop" in r.text
        r = http.post("/v1/messages?beta=true", json={**CLAUDE_CODE_LIKE, "stream": False}, headers=h)
        assert r.status_code == 200 and r.json()["content"][0]["input"] == {"key": "a"}
        r = http.post("/v1/messages/count_tokens?beta=true", json={k: v for k, v in CLAUDE_CODE_LIKE.items()
                                                                   if k not in ("max_tokens", "stream")}, headers=h)
        assert r.status_code == 200 and r.json()["input_tokens"] == srv.server.registry.get(
            ep["episode_id"]).calls[0].prompt_ids.__len__()
        recorded = srv.server.registry.get(ep["episode_id"]).calls[0].messages
    assert [m["role"] for m in recorded] == ["system", "system", "user"]
    assert recorded[0]["content"].startswith("x-anthropic-billing-header") and "Be careful." in recorded[0]["content"]


def test_a_sub_agent_with_another_system_prompt_is_its_own_timeline(make_server) -> None:
    """Claude Code's Agent tool: the sub-agent's calls (another system prompt, the same agent name) form their
    own sample in the episode; the main conversation's calls still merge into one."""
    srv = make_server("tiny", admin_token="adm1n")

    async def main() -> str:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            an = client(ep)
            main_conv = [{"role": "user", "content": "plan the work"}]
            first = await an.messages.create(model="tiny", system="You are the main agent.", messages=main_conv,
                                             max_tokens=6)
            await an.messages.create(model="tiny", system="You are a search sub-agent.", max_tokens=6,
                                     messages=[{"role": "user", "content": "search the code"}])
            main_conv += [{"role": "assistant", "content": first.content[0].text},
                          {"role": "user", "content": "the sub-agent found nothing"}]
            await an.messages.create(model="tiny", system="You are the main agent.", messages=main_conv, max_tokens=6)
            ep.reward(1.0)
        return ep.episode_id

    tr = trace(srv, asyncio.run(main()))
    assert sorted(s["call_indices"] for s in tr["samples"]) == [[0, 2], [1]]
    assert {s["agent"] for s in tr["samples"]} == {"default"} and tr["report"]["merged_calls"] == 1
