"""``POST /v1/responses``: OpenAI's Responses API (what Codex CLI and the OpenAI Agents SDK speak) on the one
chat call. The body is translated into a ``CallRequest`` (input items -> chat messages, function and custom tools
-> function tools), the same ``ChatCall`` generates and records, and the answer is rendered as a ``response``
object or as the event stream the official SDK's ``responses.stream()`` parses. Which fields are served, ignored
or refused: docs/harnesses.md."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from agentjet.engines.base import MAX_SEED, FinishReason
from agentjet.protocol import AGENT_HEADER
from agentjet.server.episodes.chat_call import Api, CallRequest, ChatCall, Reply
from agentjet.server.errors import APIError, bad_request
from agentjet.server.http.deps import EchoJSONResponse, bearer, server_of
from agentjet.server.http.openai_api import token_logprobs
from agentjet.server.http.streaming import TokenStream

LOGPROBS_INCLUDE = "message.output_text.logprobs"
TEXT_PARTS = ("input_text", "output_text", "text")
CUSTOM_TOOL_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


class ResponsesRequest(BaseModel):
    """The fields served; the ignored ones pass as extras (``model_config``); the refused ones are checked in
    ``responses_request``."""

    model_config = ConfigDict(extra="allow")
    model: str | None = Field(default=None, max_length=200)
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=2**31 - 1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stop: str | list[str] | None = None  # not OpenAI's, but served (as in chat)
    seed: int | None = Field(default=None, ge=0, lt=MAX_SEED)  # not OpenAI's: an AgentJet extension
    include: list[str] | None = None
    store: bool | None = None
    previous_response_id: str | None = Field(default=None, max_length=200)
    stream: bool | None = False
    text: dict[str, Any] | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    metadata: dict[str, Any] | None = None


# ------------------------------------------------------------------------------------------- request
def _text(content: Any, where: str) -> str:
    """A message's content (a string or text parts) as text; images, files and audio are refused."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of content parts", param=f"{where}.content")
    pieces = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif kind == "refusal":
            pieces.append(str(part.get("refusal") or ""))
        else:
            raise bad_request(f"{where}.content[{j}] has type {kind!r}: this text model takes only text parts "
                              f"({', '.join(TEXT_PARTS)})", param=f"{where}.content[{j}]")
    return "".join(pieces)


def _str_field(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise bad_request(f"{where}.{name} must be a string", param=f"{where}.{name}")
    return value


def _tool_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``function_call`` or ``custom_tool_call`` input item as a chat tool call (a custom tool's text input is
    the argument ``input``; a namespaced tool's name is qualified, as the model wrote it)."""
    name, call_id = _str_field(item, "name", where), _str_field(item, "call_id", where)
    if item.get("namespace") is not None:
        name = qualified(_str_field(item, "namespace", where), name)
    if item["type"] == "custom_tool_call":
        arguments = json.dumps({"input": _str_field(item, "input", where)})
    else:
        arguments = _str_field(item, "arguments", where)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def input_messages(items: str | list[Any]) -> list[dict[str, Any]]:
    """Responses input as chat messages. A run of function calls joins the assistant message before it (the
    model's one turn: its text and its calls), so a resent turn renders as the model generated it."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise bad_request(f"{where}.role {role!r} is not one of user, assistant, system, developer",
                                  param=f"{where}.role")
            out.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind in ("function_call", "custom_tool_call"):
            call = _tool_call(item, where)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out.append({"role": "tool", "tool_call_id": _str_field(item, "call_id", where),
                        "content": _text(item.get("output"), where)})
        elif kind == "reasoning":
            continue  # accepted and ignored: this model writes no reasoning items, so none is its own
        else:
            raise bad_request(f"{where} has type {kind!r}; served: message, function_call, function_call_output, "
                              "custom_tool_call, custom_tool_call_output (and reasoning, ignored)", param=where)
    return out


def qualified(namespace: str, name: str) -> str:
    """A namespaced tool's name as the model sees and calls it."""
    return f"{namespace}.{name}"


@dataclass
class ResponseTools:
    """The request's tools as chat function tools, and what the reply's calls must be turned back into: the custom
    tools (their text as ``input``) and the namespaced ones (qualified name -> namespace and name)."""

    tools: list[dict[str, Any]] | None = None
    custom: set[str] = field(default_factory=set)
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)

    def add(self, t: Any, where: str, namespace: str | None = None) -> None:
        kind = t.get("type") if isinstance(t, dict) else None
        if kind == "namespace" and namespace is None:
            ns = _str_field(t, "name", where)
            members = t.get("tools")
            if not isinstance(members, list) or not members:
                raise bad_request(f"{where}.tools must be a list of function or custom tools", param=f"{where}.tools")
            for j, member in enumerate(members):
                self.add(member, f"{where}.tools[{j}]", ns)
            return
        if kind not in ("function", "custom"):
            raise bad_request(f"{where} has type {kind!r}: only function, custom and namespace tools are served "
                              "(a built-in tool such as web_search runs on OpenAI's side, not here; Codex CLI: "
                              "-c web_search=\"disabled\")", param=f"{where}.type")
        name = _str_field(t, "name", where)
        if namespace is not None:
            self.namespaced[qualified(namespace, name)] = (namespace, name)
            name = qualified(namespace, name)
        fn: dict[str, Any] = {"name": name}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        if kind == "custom":
            self.custom.add(name)
            fn["parameters"] = CUSTOM_TOOL_PARAMETERS
        elif t.get("parameters") is not None:
            fn["parameters"] = t["parameters"]
        self.tools = [*(self.tools or []), {"type": "function", "function": fn}]


def tools_of(tools: list[Any] | None) -> ResponseTools:
    """Function, custom and namespace tools as chat function tools (a custom tool takes its text as ``input``; a
    namespace's tools are named ``namespace.name``). A built-in tool (web_search, file_search, ...) is refused,
    naming it."""
    out = ResponseTools()
    for i, t in enumerate(tools or []):
        out.add(t, f"tools[{i}]")
    if tools is not None and out.tools is None:
        out.tools = []
    return out


def tool_choice_of(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice  # none / auto / required (others: a 400 from the call)
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom") and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
                      param="tool_choice")


def responses_request(body: ResponsesRequest) -> tuple[CallRequest, ResponseTools]:
    """The body as the call's request, and its tools (to turn the reply's calls back into items)."""
    for name in ("conversation", "prompt"):
        if getattr(body, name) is not None:
            raise bad_request(f"{name} is not supported: send the input items (or previous_response_id)", param=name)
    if body.background:
        raise bad_request("background responses are not supported", param="background")
    fmt = (body.text or {}).get("format") or {}
    if not isinstance(fmt, dict) or fmt.get("type", "text") != "text":
        raise bad_request("only text.format {'type': 'text'} is supported", param="text.format")
    tools = tools_of(body.tools)
    logprobs = LOGPROBS_INCLUDE in (body.include or []) or bool(body.top_logprobs)
    return CallRequest(
        Api.RESPONSES, messages=input_messages(body.input), instructions=body.instructions or None,
        tools=tools.tools or None,
        tool_choice=tool_choice_of(body.tool_choice), model=body.model, temperature=body.temperature,
        top_p=body.top_p, max_tokens=body.max_output_tokens, stop=body.stop, seed=body.seed, logprobs=logprobs,
        top_logprobs=body.top_logprobs, stream=bool(body.stream), clamp_max_tokens=True,
        previous_response_id=body.previous_response_id, store=body.store is not False), tools


# -------------------------------------------------------------------------------------------- answer
class ResponseView:
    """The ``response`` object of one call and its output items."""

    def __init__(self, call: ChatCall, body: ResponsesRequest, tools: ResponseTools, tokenizer: Any,
                 model: str) -> None:
        self.call, self.body, self.tools, self.tokenizer, self.model = call, body, tools, tokenizer, model
        self.message_id = "msg_" + uuid.uuid4().hex

    def message_item(self, text: str, status: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant",
                "content": [] if status == "in_progress" else [self.text_part(text, logprobs)]}

    @staticmethod
    def text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}

    def call_items(self, reply: Reply) -> list[dict[str, Any]]:
        items = []
        for tc in reply.message.get("tool_calls") or []:
            name, arguments = tc["function"]["name"], tc["function"]["arguments"]
            namespace, short = self.tools.namespaced.get(name, (None, name))
            where = {"namespace": namespace} if namespace is not None else {}
            if name in self.tools.custom:
                items.append({"type": "custom_tool_call", "id": "ctc_" + uuid.uuid4().hex, "call_id": tc["id"],
                              "name": short, **where, "input": _custom_input(arguments), "status": "completed"})
            else:
                items.append({"type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": tc["id"],
                              "name": short, **where, "arguments": arguments, "status": "completed"})
        return items

    def logprobs(self, reply: Reply) -> list[dict[str, Any]] | None:
        return token_logprobs(self.tokenizer, reply.result) if self.call.request.logprobs else None

    def output(self, reply: Reply) -> list[dict[str, Any]]:
        content = reply.message.get("content") or ""
        calls = self.call_items(reply)
        message = ([self.message_item(content, _status(reply), self.logprobs(reply))]
                   if content or not calls else [])
        return message + calls

    def response(self, status: str, output: list[dict[str, Any]], reply: Reply | None = None) -> dict[str, Any]:
        body = self.body
        usage = None
        if reply is not None:
            prompt, generated = len(self.call.prompt_ids), len(reply.result.token_ids)
            usage = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                     "output_tokens": generated, "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": prompt + generated}
        return {
            "id": self.call.id, "object": "response", "created_at": self.call.created, "status": status,
            "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
            "error": None, "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "model": self.model,
            "output": output, "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id, "reasoning": {"effort": None, "summary": None},
            "store": self.call.request.store, "temperature": body.temperature, "top_p": body.top_p,
            "text": {"format": {"type": "text"}}, "tool_choice": body.tool_choice or "auto",
            "tools": body.tools or [], "truncation": "disabled", "usage": usage, "metadata": body.metadata or {},
        }


def _custom_input(arguments: str) -> str:
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    return str(parsed["input"]) if isinstance(parsed, dict) and "input" in parsed else arguments


def _status(reply: Reply) -> str:
    """``incomplete`` when the reply stopped at the token limit (and is not a completed tool call)."""
    stopped_at_limit = reply.result.finish_reason is FinishReason.LENGTH and not reply.message.get("tool_calls")
    return "incomplete" if stopped_at_limit else "completed"


async def create_response(request: Request, body: ResponsesRequest, key: str | None = Depends(bearer)) -> Any:
    server = server_of(request)
    req, tools = responses_request(body)
    call = await server.chat.open(req, key, request.headers.get(AGENT_HEADER))
    view = ResponseView(call, body, tools, server.engine.tokenizer, server.config.name)
    if body.stream:
        return StreamingResponse(_events(view), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    (reply,) = await call.complete()
    return EchoJSONResponse(view.response(_status(reply), view.output(reply), reply))


class _Events:
    """The stream's events, numbered in order."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        event = {"type": kind, "sequence_number": self.n, **fields}
        self.n += 1
        return f"event: {kind}\ndata: {json.dumps(event)}\n\n"


async def _events(view: ResponseView) -> AsyncIterator[str]:
    """The event sequence of OpenAI's Responses stream: created, in_progress; the message item (added, its text
    part added, text deltas, text done, part done, item done); each function call (added, its arguments' delta
    and done, item done); then completed (or incomplete at the token limit; failed on an engine error)."""
    ev, call = _Events(), view.call
    started = view.response("in_progress", [])
    item = {"item_id": view.message_id, "output_index": 0, "content_index": 0}
    opened = False  # the message item was announced
    async with TokenStream(call, view.tokenizer) as stream:
        yield ev("response.created", response=started)
        yield ev("response.in_progress", response=started)

        def open_message() -> list[str]:
            return [ev("response.output_item.added", output_index=0, item=view.message_item("", "in_progress")),
                    ev("response.content_part.added", **item, part=view.text_part(""))]

        async for piece in stream.text():
            if not opened:
                for e in open_message():
                    yield e
                opened = True
            yield ev("response.output_text.delta", **item, delta=piece, logprobs=[])
        try:
            reply = stream.finish()
        except APIError as err:
            failed = view.response("failed", [])
            failed["error"] = {"code": err.code or err.type, "message": err.message}
            yield ev("response.failed", response=failed)
            return
        output = view.output(reply)
        index = 0
        if output and output[0]["type"] == "message":
            if not opened:
                for e in open_message():
                    yield e
            if rest := stream.rest(reply.message.get("content")):
                yield ev("response.output_text.delta", **item, delta=rest, logprobs=[])
            part = output[0]["content"][0]
            yield ev("response.output_text.done", **item, text=part["text"], logprobs=part["logprobs"])
            yield ev("response.content_part.done", **item, part=part)
            yield ev("response.output_item.done", output_index=0, item=output[0])
            index = 1
        for i, done in enumerate(output[index:], start=index):
            added = {**done, "status": "in_progress", **({"arguments": ""} if "arguments" in done else {"input": ""})}
            yield ev("response.output_item.added", output_index=i, item=added)
            if done["type"] == "function_call":
                at = {"item_id": done["id"], "output_index": i}
                yield ev("response.function_call_arguments.delta", **at, delta=done["arguments"])
                yield ev("response.function_call_arguments.done", **at, name=done["name"],
                         arguments=done["arguments"])
            else:
                at = {"item_id": done["id"], "output_index": i}
                yield ev("response.custom_tool_call_input.delta", **at, delta=done["input"])
                yield ev("response.custom_tool_call_input.done", **at, input=done["input"])
            yield ev("response.output_item.done", output_index=i, item=done)
        status = _status(reply)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield ev(kind, response=view.response(status, output, reply))


def add_routes(router: APIRouter) -> None:
    """This API's routes, on the app's one ``/v1`` router (``app.py``)."""
    router.add_api_route("/responses", create_response, methods=["POST"], response_model=None)
