"""The lookup task (``agentjet.tasks.lookup``) through the harness APIs: the same tasks, tools, reward, trace and
budget, with the agent written on another SDK, so that its learning can be set beside the chat-completions agent's
at the same budget (``benchmarks/learning/harness_lookup.py``).

- ``lookup-agents``: the OpenAI Agents SDK's ``Runner.run`` on its default model (the Responses API), the two
  tables' tools as ``function_tool``s, up to ``MAX_TURNS`` model calls.
- ``lookup-anthropic``: the Anthropic SDK's ``messages.create`` with the tools as client tools, an ordinary
  ``tool_use`` / ``tool_result`` loop of up to ``MAX_TURNS`` calls.

The worked example of the prompt goes in as each API's own history (Responses items; Anthropic blocks). An SDK
that gives up (a reply cut at the token limit, a call to a tool it does not know, too many turns) ends the episode
with reward 0: the calls it made are trained like any other. ``ajet demo --task lookup-agents``. The SDKs are the
dev extra's pins (``openai-agents``, ``anthropic``), imported when an episode runs. Pure Python: no server imports.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, cast

from agentjet.tasks import lookup
from agentjet.tasks.lookup import MAX_TURNS, TOOLS, EpisodeTrace, parse_call, reward, run_tool
from agentjet.tasks.lookup import EpisodeTrace as Trace

Rollout = Callable[..., Awaitable[float]]


def _answer(task: dict[str, Any], text: str, trace: EpisodeTrace) -> float:
    trace.unparsed += "<tool_call>" in text
    trace.transcript.append(f"answer {text!r}")
    trace.reward = reward(task, text)
    return trace.reward


def _tool(task: dict[str, Any], name: str, arguments: str, trace: EpisodeTrace) -> str:
    call = parse_call(name, arguments)
    result = run_tool(task, call)
    trace.calls.append(call)
    trace.transcript.append(f"call {call.name}({call.arguments}) -> {result}")
    return result


def responses_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The task's messages after the system prompt as Responses input items (worked tool calls included)."""
    items: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        elif m.get("tool_calls"):
            items += [{"type": "function_call", "call_id": tc["id"], "name": tc["function"]["name"],
                       "arguments": tc["function"]["arguments"]} for tc in m["tool_calls"]]
        else:
            items.append({"role": m["role"], "content": m["content"]})
    return items


async def agents_rollout(task: dict[str, Any], ep: Any, sampling: dict[str, Any], *,
                         trace: EpisodeTrace | None = None, max_turns: int = MAX_TURNS) -> float:
    """The lookup agent on the OpenAI Agents SDK (its default model: the Responses API); returns the reward."""
    import openai
    from agents import Agent, AgentsException, FunctionTool, ModelSettings, RunConfig, Runner
    from agents.models.openai_provider import OpenAIProvider

    trace = trace if trace is not None else EpisodeTrace()

    def tool(spec: dict[str, Any]) -> FunctionTool:
        name = spec["function"]["name"]

        async def invoke(_ctx: Any, arguments: str) -> str:
            return _tool(task, name, arguments, trace)

        return FunctionTool(name=name, description=spec["function"]["description"],
                            params_json_schema=spec["function"]["parameters"], on_invoke_tool=invoke,
                            strict_json_schema=False)

    settings = ModelSettings(temperature=sampling.get("temperature"), top_p=sampling.get("top_p"),
                             max_tokens=sampling.get("max_tokens"),
                             extra_body={"seed": sampling["seed"]} if "seed" in sampling else None)
    agent = Agent(name="lookup", instructions=task["messages"][0]["content"], model=ep.model,
                  tools=[tool(t) for t in TOOLS], model_settings=settings)
    async with openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=2) as client:
        config = RunConfig(model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True)
        try:
            result = await Runner.run(agent, cast(Any, responses_items(task["messages"][1:])), run_config=config,
                                      max_turns=max_turns)
        except (AgentsException, openai.BadRequestError) as exc:  # cut at the limit, an unknown tool, too many
            trace.transcript.append(f"gave up: {type(exc).__name__}")  # turns, a history that no longer fits
            run = getattr(exc, "run_data", None)
            trace.turns += len(run.raw_responses) if run is not None else 0
            return 0.0
    trace.turns += len(result.raw_responses)
    return _answer(task, str(result.final_output or ""), trace)


def anthropic_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The task's messages after the system prompt as Anthropic messages (tool calls and results as blocks)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            out.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": m["tool_call_id"],
                                                     "content": m["content"]}]})
        elif m.get("tool_calls"):
            out.append({"role": "assistant", "content": [
                {"type": "tool_use", "id": tc["id"], "name": tc["function"]["name"],
                 "input": json.loads(tc["function"]["arguments"])} for tc in m["tool_calls"]]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


ANTHROPIC_TOOLS: list[dict[str, Any]] = [
    {"name": fn["name"], "description": fn["description"], "input_schema": fn["parameters"]}
    for fn in (cast(dict[str, Any], t["function"]) for t in TOOLS)]


async def anthropic_rollout(task: dict[str, Any], ep: Any, sampling: dict[str, Any], *,
                            trace: EpisodeTrace | None = None, max_turns: int = MAX_TURNS) -> float:
    """The lookup agent on the Anthropic SDK (``messages.create`` with tools); returns the reward."""
    import anthropic

    trace = trace if trace is not None else EpisodeTrace()
    messages = anthropic_messages(task["messages"][1:])
    extra = {k: sampling[k] for k in ("temperature", "top_p", "seed") if k in sampling}  # (seed: AgentJet's)
    async with anthropic.AsyncAnthropic(base_url=ep.anthropic_base_url, api_key=ep.api_key, max_retries=2) as client:
        for _ in range(max_turns):
            reply = await client.messages.create(model=ep.model, system=task["messages"][0]["content"],
                                                 messages=cast(Any, messages), tools=cast(Any, ANTHROPIC_TOOLS),
                                                 max_tokens=int(sampling.get("max_tokens", 40)), extra_body=extra)
            trace.turns += 1
            uses = [b for b in reply.content if b.type == "tool_use"]
            if not uses:
                return _answer(task, "".join(b.text for b in reply.content if b.type == "text"), trace)
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": b.id, "content": _tool(task, b.name, json.dumps(b.input), trace)}
                for b in uses]})
    return 0.0  # no answer within max_turns calls


class LookupThrough:
    """The lookup task source with its rollout on another SDK (``agentjet.tasks.source.TaskSource``)."""

    SAMPLING = lookup.SAMPLING
    EVAL_SAMPLING = lookup.EVAL_SAMPLING
    RECOMMENDED = lookup.RECOMMENDED
    EpisodeTrace = Trace  # what the demo traces each eval episode with

    def __init__(self, name: str, rollout: Rollout) -> None:
        self.NAME = name
        self.rollout = rollout

    def generate_tasks(self, split: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
        return lookup.generate_tasks(split, n, seed)

    def reward(self, task: dict[str, Any], text: str) -> float:
        return reward(task, text)

    def tool_use_summary(self, tasks: list[dict[str, Any]], traces: list[Trace]) -> dict[str, float]:
        return lookup.tool_use_summary(tasks, traces)


AGENTS = LookupThrough("lookup-agents", agents_rollout)
ANTHROPIC = LookupThrough("lookup-anthropic", anthropic_rollout)
