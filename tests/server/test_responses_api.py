"""``POST /v1/responses`` against a live server, through the real, pinned SDKs: openai's Responses client (plain,
streamed, a function call and its output sent back, ``previous_response_id``) and the OpenAI Agents SDK's
``Runner.run`` on its default model with a function tool. The tiny model generates where the test needs real
ids; a scripted reply (tests/server/harness_helpers.py) where it needs a tool call."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
from tests.server.harness_helpers import TOOL_RESULT, lookup_server, trace

from agentjet import SwarmClient

TOOLS = [{"type": "function", "name": "lookup", "description": "look a key up",
          "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}]
STREAM_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
                 "response.content_part.added"]
TEXT_DONE = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def client(ep: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0)


@pytest.fixture
def scripted(make_server, tiny_model_path):
    return lookup_server(make_server, tiny_model_path)


def test_plain_and_streamed_responses_are_the_chat_call(make_server) -> None:
    """A response is the chat completion of the same messages (same seed, same text and token counts); the
    stream is the SDK's event sequence, its deltas the text."""
    srv = make_server("tiny", admin_token="adm1n")

    async def main() -> tuple[Any, ...]:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            oa = client(ep)
            chat = await oa.chat.completions.create(model="tiny", messages=[{"role": "system", "content": "Be terse."},
                                                                            {"role": "user", "content": "hi"}],
                                                    max_tokens=12, seed=5)
            plain = await oa.responses.create(model="tiny", instructions="Be terse.", input="hi",
                                              max_output_tokens=12, extra_body={"seed": 5})
            stop = plain.output_text[4:7]
            events = []
            async with oa.responses.stream(model="tiny", instructions="Be terse.", input="hi",
                                           max_output_tokens=12, extra_body={"seed": 5, "stop": [stop]}) as stream:
                async for event in stream:
                    events.append(event)
                final = await stream.get_final_response()
            ep.reward(0.0)
        return chat, plain, events, final, stop, ep.episode_id

    chat, plain, events, final, stop, eid = asyncio.run(main())
    assert plain.output_text == chat.choices[0].message.content and plain.output_text
    assert plain.usage.input_tokens == chat.usage.prompt_tokens
    assert plain.usage.output_tokens == chat.usage.completion_tokens == 12
    assert plain.status == "incomplete" and plain.incomplete_details.reason == "max_output_tokens"
    assert plain.id.startswith("resp_") and plain.model == "tiny"
    types = [e.type for e in events]
    assert types[:4] == STREAM_EVENTS and types[-4:] == [*TEXT_DONE, "response.completed"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == plain.output_text[: plain.output_text.index(stop)]  # the stop string cut it
    assert final.status == "completed" and [e.sequence_number for e in events] == list(range(len(events)))
    calls = trace(srv, eid)["samples"]
    assert sorted(c["api"] for s in calls for c in s["calls"]) == ["chat.completions", "responses", "responses"]


def test_a_response_stopped_at_the_limit_streams_response_incomplete(make_server) -> None:
    srv = make_server("tiny")

    async def main() -> list[Any]:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            async with client(ep).responses.stream(model="tiny", input="hi", max_output_tokens=5) as stream:
                events = [e async for e in stream]
            ep.reward(0.0)
        return events

    events = asyncio.run(main())
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.usage.output_tokens == 5


def test_a_function_call_and_its_output_sent_back_merge_into_one_sample(scripted) -> None:
    srv = scripted

    async def main() -> tuple[Any, ...]:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            oa = client(ep)
            first = await oa.responses.create(model="tiny", input="what is a?", tools=TOOLS, store=False)
            (call,) = first.output
            history = [{"role": "user", "content": "what is a?"}, call.model_dump(exclude_none=True),
                       {"type": "function_call_output", "call_id": call.call_id, "output": TOOL_RESULT}]
            second = await oa.responses.create(model="tiny", input=history, tools=TOOLS, store=False)
            async with oa.responses.stream(model="tiny", input="what is a?", tools=TOOLS) as stream:
                kinds = [e.type async for e in stream]
                streamed = await stream.get_final_response()
            ep.reward(1.0)
        return first, second, kinds, streamed, ep.episode_id

    first, second, kinds, streamed, eid = asyncio.run(main())
    (call,) = first.output
    assert call.type == "function_call" and call.name == "lookup" and call.arguments == '{"key": "a"}'
    assert first.status == "completed" and second.output_text == "The value is 7431."
    assert [o.type for o in streamed.output] == ["function_call"] and streamed.output[0].arguments == '{"key": "a"}'
    assert kinds[-4:] == ["response.function_call_arguments.delta", "response.function_call_arguments.done",
                          "response.output_item.done", "response.completed"]
    samples = trace(srv, eid)["samples"]
    merged = next(s for s in samples if len(s["call_indices"]) > 1)
    assert merged["call_indices"] == [0, 1]  # the harness resent the whole history: one sample for the loop


def test_previous_response_id_continues_the_conversation_within_its_episode(make_server) -> None:
    srv = make_server("tiny", admin_token="adm1n")

    async def main() -> tuple[Any, ...]:
        async with SwarmClient(srv.url) as c:
            async with c.episode(task_id="t") as ep:
                oa = client(ep)
                first = await oa.responses.create(model="tiny", instructions="Be terse.", input="hello there",
                                                  max_output_tokens=6)
                second = await oa.responses.create(model="tiny", instructions="Be terse.", input="and then?",
                                                   previous_response_id=first.id, max_output_tokens=6)
                unstored = await oa.responses.create(model="tiny", input="x", store=False, max_output_tokens=2)
                with pytest.raises(openai.NotFoundError, match="not a stored response of this episode"):
                    await oa.responses.create(model="tiny", input="y", previous_response_id=unstored.id)
                seen = srv.server.registry.get(ep.episode_id).calls[1].messages
                ep.reward(1.0)
            async with c.episode(task_id="u") as other:
                with pytest.raises(openai.NotFoundError):
                    await client(other).responses.create(model="tiny", input="z", previous_response_id=first.id)
                other.reward(0.0)
        return first, second, seen, ep.episode_id

    first, second, seen, eid = asyncio.run(main())
    assert second.previous_response_id == first.id
    assert [m["role"] for m in seen] == ["system", "user", "assistant", "user"]
    assert seen[1]["content"] == "hello there" and seen[3]["content"] == "and then?"
    assert seen[2]["content"] == first.output_text
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    samples = trace(srv, eid)["samples"]
    assert [s["call_indices"] for s in samples] == [[0, 1], [2]]  # the continued call merged with the first


CODEX_LIKE = {
    "model": "tiny", "instructions": "You are a coding agent.", "stream": True, "store": False,
    "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>"}]},
              {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment>"}]},
              {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]}],
    "tools": [{"type": "function", "name": "shell", "description": "run a command", "strict": False,
               "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                              "required": ["command"]}},
              {"type": "custom", "name": "apply_patch", "description": "edit files", "format": {"type": "grammar"}}],
    "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": {"effort": "medium", "summary": "auto"},
    "include": ["reasoning.encrypted_content"], "prompt_cache_key": "0199-thread", "client_metadata": {"x": "y"},
    "text": {"verbosity": "medium"}, "service_tier": "auto",
}


def test_what_codex_sends_is_served_and_what_cannot_be_honoured_is_refused_by_name(scripted) -> None:
    srv = scripted
    with httpx.Client(base_url=srv.url, timeout=60) as http:
        ep = http.post("/swarm/v1/episodes", json={"client_id": "c", "task_id": "t"}).json()
        h = {"Authorization": f"Bearer {ep['api_key']}", "Accept": "text/event-stream"}
        r = http.post("/v1/responses", json=CODEX_LIKE, headers=h)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert '"type": "response.completed"' in r.text and '"name": "lookup"' in r.text
        refused = [({"tools": [{"type": "web_search"}]}, "tools[0].type", "built-in"),
                   ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                    "input[0].content[0]", "text parts"),
                   ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]", "item_reference"),
                   ({"text": {"format": {"type": "json_schema"}}}, "text.format", "text"),
                   ({"conversation": "conv_1"}, "conversation", "not supported"),
                   ({"background": True}, "background", "not supported"),
                   ({"tool_choice": {"type": "allowed_tools"}}, "tool_choice", "tool_choice")]
        for extra, param, fragment in refused:
            r = http.post("/v1/responses", json={**CODEX_LIKE, "stream": False, **extra}, headers=h)
            assert r.status_code == 400, (extra, r.text)
            err = r.json()["error"]
            assert err["param"] == param and fragment in err["message"], err
        assert len(srv.server.registry.get(ep["episode_id"]).calls) == 1  # nothing refused was recorded


def test_the_agents_sdk_runs_a_function_tool_on_its_default_model(scripted) -> None:
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.models.openai_provider import OpenAIProvider

    srv = scripted
    looked_up: list[str] = []

    @function_tool
    def lookup(key: str) -> str:
        """Look a key up."""
        looked_up.append(key)
        return TOOL_RESULT

    async def main() -> tuple[Any, str]:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            agent = Agent(name="finder", instructions="Answer with the value.", model="tiny", tools=[lookup])
            config = RunConfig(model_provider=OpenAIProvider(openai_client=client(ep)), tracing_disabled=True)
            result = await Runner.run(agent, "what is a?", run_config=config)
            ep.reward(1.0)
        return result, ep.episode_id

    result, eid = asyncio.run(main())
    assert looked_up == ["a"] and result.final_output == "The value is 7431."
    samples = trace(srv, eid)["samples"]
    assert len(samples) == 1 and samples[0]["call_indices"] == [0, 1]
    assert {c["api"] for c in samples[0]["calls"]} == {"responses"}


def test_the_answer_and_every_event_validate_strictly_against_the_sdks_types(scripted) -> None:
    """The SDK parses leniently; a stricter client validates: the response and each stream event hold every
    field the pinned SDK's types require."""
    import json

    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    with httpx.Client(base_url=scripted.url, timeout=60) as http:
        ep = http.post("/swarm/v1/episodes", json={"client_id": "c", "task_id": "t"}).json()
        h = {"Authorization": f"Bearer {ep['api_key']}"}
        body = {"model": "tiny", "input": "what is a?", "tools": TOOLS, "include": ["message.output_text.logprobs"]}
        made = Response.model_validate(http.post("/v1/responses", json=body, headers=h).json())
        streamed = http.post("/v1/responses", json={**body, "stream": True}, headers=h).text
    assert [o.type for o in made.output] == ["function_call"] and made.usage.total_tokens > 0
    events = [TypeAdapter(ResponseStreamEvent).validate_python(json.loads(line[6:]))
              for line in streamed.splitlines() if line.startswith("data: ")]
    assert [e.type for e in events][2:] == ["response.output_item.added", "response.function_call_arguments.delta",
                                           "response.function_call_arguments.done", "response.output_item.done",
                                           "response.completed"]


def test_a_namespaced_tool_is_called_and_sent_back_under_its_namespace(make_server, tiny_model_path) -> None:
    """A ``namespace`` tool (Codex sends its sub-agent tools as one) reaches the model as ``namespace.name``
    function tools; the model's call comes back as a ``function_call`` with ``name`` and ``namespace`` apart, and
    that call resent with its output continues the same conversation (one merged sample)."""
    from tests.server.harness_helpers import scripted_engine, tool_call_text
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    replies = [tool_call_text(tok, "agents_v1.spawn", {"task": "a"}), "Spawned."]
    srv = make_server(scripted_engine(tok, replies), admin_token="adm1n")
    tools = [{"type": "namespace", "name": "agents_v1", "description": "sub-agents",
              "tools": [{"type": "function", "name": "spawn", "description": "start one",
                         "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}}]},
             *TOOLS]

    async def main() -> tuple[Any, Any, str]:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            oa = client(ep)
            first = await oa.responses.create(model="tiny", input="go", tools=tools, store=False)
            (call,) = first.output
            history = [{"role": "user", "content": "go"}, call.model_dump(exclude_none=True),
                       {"type": "function_call_output", "call_id": call.call_id, "output": TOOL_RESULT}]
            second = await oa.responses.create(model="tiny", input=history, tools=tools, store=False)
            ep.reward(1.0)
        return first, second, ep.episode_id

    first, second, eid = asyncio.run(main())
    (call,) = first.output
    assert call.type == "function_call" and call.name == "spawn" and call.namespace == "agents_v1"
    assert call.arguments == '{"task": "a"}' and second.output_text == "Spawned."
    merged = next(s for s in trace(srv, eid)["samples"] if len(s["call_indices"]) > 1)
    assert merged["call_indices"] == [0, 1]
    shown = tok.decode(merged["token_ids"])
    assert '"name": "agents_v1.spawn"' in shown and shown.count("agents_v1.spawn") >= 2  # offered, then called
