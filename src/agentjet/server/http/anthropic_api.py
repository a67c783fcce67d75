"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API (what Claude Code, the
Claude Agent SDK and the Anthropic SDK speak) on the one chat call. The body is translated into a
``CallRequest`` (system and content blocks -> chat messages, ``tool_use`` / ``tool_result`` -> tool calls and
tool messages, ``input_schema`` tools -> function tools), the same ``ChatCall`` generates and records, and the
answer is rendered as a ``message`` or as Anthropic's event stream. The key comes as ``x-api-key`` or as a bearer
token; errors answer in Anthropic's shape (``http/errors.py``). A ``max_tokens`` beyond the room the prompt leaves
is cut to that room (the reply then stops with ``stop_reason: max_tokens``); a prompt that leaves no room is
Anthropic's 400 "prompt is too long". Which fields are served, ignored or refused: docs/harnesses.md."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from agentjet.engines.base import MAX_SEED, FinishReason
from agentjet.protocol import AGENT_HEADER
from agentjet.server.episodes.chat_call import Api, CallRequest, ChatCall, Reply
from agentjet.server.errors import APIError, bad_request
from agentjet.server.http.deps import EchoJSONResponse, api_key, server_of
from agentjet.server.http.errors import anthropic_error_body
from agentjet.server.http.streaming import TokenStream

router = APIRouter(prefix="/v1")

IGNORED_BLOCKS = ("thinking", "redacted_thinking")  # this model writes none, so none is its own: dropped
REFUSED_BLOCKS = ("image", "document", "search_result", "container_upload")


class MessagesBase(BaseModel):
    """What ``messages`` and ``count_tokens`` share. Ignored fields (``thinking``, ``metadata``,
    ``context_management``, ``output_config``, ``cache_control``, ...) pass as extras."""

    model_config = ConfigDict(extra="allow")
    model: str | None = Field(default=None, max_length=200)
    messages: list[Any]
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    mcp_servers: list[Any] | None = None


class MessagesRequest(MessagesBase):
    max_tokens: int = Field(ge=1, le=2**31 - 1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=2**31 - 1)
    seed: int | None = Field(default=None, ge=0, lt=MAX_SEED)  # not Anthropic's: an AgentJet extension
    stream: bool | None = False


# ------------------------------------------------------------------------------------------- request
def _block_text(block: Any, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in REFUSED_BLOCKS:
            raise bad_request(f"{where} is a {kind} block: images and documents are not supported (a text model "
                              "serves here)", param=where)
        raise bad_request(f"{where} must be a text block {{'type': 'text', 'text': ...}}", param=where)
    return str(block["text"])


def _texts(content: Any, where: str) -> str:
    """A string, or text blocks joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of content blocks", param=where)
    return "".join(_block_text(b, f"{where}[{j}]") for j, b in enumerate(content))


def system_text(system: str | list[Any] | None) -> str | None:
    """The system prompt: a string, or its text blocks joined by blank lines (``cache_control`` ignored)."""
    if system is None or isinstance(system, str):
        return system or None
    return "\n\n".join(_block_text(b, f"system[{j}]") for j, b in enumerate(system)) or None


def _user_messages(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """A user turn's blocks in order: text runs as user messages, each ``tool_result`` as a tool message."""
    out: list[dict[str, Any]] = []
    text: list[str] = []
    for j, b in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if isinstance(b, dict) and b.get("type") == "tool_result":
            if text:
                out.append({"role": "user", "content": "".join(text)})
                text = []
            if not isinstance(b.get("tool_use_id"), str):
                raise bad_request(f"{at}.tool_use_id must be a string", param=f"{at}.tool_use_id")
            content = b.get("content")
            out.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                        "content": "" if content is None else _texts(content, f"{at}.content")})
        else:
            text.append(_block_text(b, at))
    if text or not out:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _assistant_message(blocks: list[Any], where: str) -> dict[str, Any]:
    """An assistant turn: its text and its ``tool_use`` blocks as one message with tool calls."""
    text: list[str] = []
    calls = []
    for j, b in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind in IGNORED_BLOCKS:
            continue
        if kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise bad_request(f"{at} must have a string id and name", param=at)
            if not isinstance(b.get("input", {}), dict):
                raise bad_request(f"{at}.input must be an object", param=f"{at}.input")
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": b.get("input", {})}})
        else:
            text.append(_block_text(b, at))
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None}
    if calls:
        msg["tool_calls"] = calls
    return msg


def chat_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """Anthropic messages as chat messages (a ``system``-role message stays a system message in place)."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant", "system"):
            raise bad_request(f"{where}.role {role!r} is not one of user, assistant, system", param=f"{where}.role")
        content = m.get("content")
        if role == "system":
            out.append({"role": "system", "content": _texts(content, f"{where}.content")})
        elif isinstance(content, str):
            out.append({"role": role, "content": content})
        elif not isinstance(content, list):
            raise bad_request(f"{where}.content must be a string or a list of content blocks",
                              param=f"{where}.content")
        elif role == "user":
            out += _user_messages(content, where)
        else:
            out.append(_assistant_message(content, where))
    return out


def tools_of(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Client tools (``name``, ``description``, ``input_schema``) as function tools; Anthropic's own tool types
    (``bash_...``, ``web_search_...``, ``text_editor_...``, ...) are refused, naming the tool."""
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        kind = t.get("type", "custom") if isinstance(t, dict) else None
        if kind != "custom" or not isinstance(t.get("name"), str):
            raise bad_request(f"tools[{i}] must be a client tool {{'name', 'description', 'input_schema'}}; "
                              f"Anthropic's own tools (type {kind!r}) are not served here", param=f"tools[{i}]")
        fn: dict[str, Any] = {"name": t["name"]}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        if t.get("input_schema") is not None:
            fn["parameters"] = t["input_schema"]
        out.append({"type": "function", "function": fn})
    return out


def tool_choice_of(choice: dict[str, Any] | None) -> Any:
    kind = None if choice is None else choice.get("type")
    if choice is None:
        return None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request("tool_choice must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}",
                      param="tool_choice")


def messages_request(body: MessagesBase) -> CallRequest:
    if body.mcp_servers:
        raise bad_request("mcp_servers are not supported: give the tools as client tools", param="mcp_servers")
    common: dict[str, Any] = {
        "messages": chat_messages(body.messages), "instructions": system_text(body.system),
        "tools": tools_of(body.tools), "tool_choice": tool_choice_of(body.tool_choice), "model": body.model}
    if not isinstance(body, MessagesRequest):
        return CallRequest(Api.MESSAGES, **common)
    return CallRequest(Api.MESSAGES, **common, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                       max_tokens=body.max_tokens, stop=body.stop_sequences, seed=body.seed, stream=bool(body.stream),
                       clamp_max_tokens=True)


# -------------------------------------------------------------------------------------------- answer
def _tool_use(tc: dict[str, Any]) -> dict[str, Any]:
    try:
        args = json.loads(tc["function"]["arguments"] or "{}")
    except ValueError:
        args = {}
    return {"type": "tool_use", "id": tc["id"], "name": tc["function"]["name"],
            "input": args if isinstance(args, dict) else {"value": args}}


def content_blocks(reply: Reply) -> list[dict[str, Any]]:
    text = reply.message.get("content") or ""
    return ([{"type": "text", "text": text}] if text else []) + [_tool_use(tc) for tc in
                                                                 reply.message.get("tool_calls") or []]


def stop_of(call: ChatCall, reply: Reply) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence``."""
    if reply.message.get("tool_calls"):
        return "tool_use", None
    if reply.result.finish_reason is FinishReason.LENGTH:
        return "max_tokens", None
    matched = call.stop_sequence(reply.result)
    return ("stop_sequence", matched) if matched is not None else ("end_turn", None)


def _usage(call: ChatCall, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": len(call.prompt_ids), "output_tokens": output_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0}


def message_object(call: ChatCall, model: str, content: list[dict[str, Any]], reply: Reply | None) -> dict[str, Any]:
    stop, sequence = stop_of(call, reply) if reply is not None else (None, None)
    return {"id": call.id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop, "stop_sequence": sequence,
            "usage": _usage(call, len(reply.result.token_ids) if reply is not None else 0)}


@router.post("/messages", response_model=None)
async def create_message(request: Request, body: MessagesRequest, key: str | None = Depends(api_key)) -> Any:
    """Anthropic Messages (``?beta=true``, ``anthropic-version`` and ``anthropic-beta`` are accepted as sent)."""
    server = server_of(request)
    call = await server.chat.open(messages_request(body), key, request.headers.get(AGENT_HEADER))
    model = body.model or server.config.name
    if body.stream:
        return StreamingResponse(_events(call, server.engine.tokenizer, model), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    (reply,) = await call.complete()
    return EchoJSONResponse(message_object(call, model, content_blocks(reply), reply))


@router.post("/messages/count_tokens", response_model=None)
async def count_tokens(request: Request, body: MessagesBase, key: str | None = Depends(api_key)) -> Any:
    """The prompt's tokens as ``/v1/messages`` would render it (the chat template, tools included)."""
    return {"input_tokens": server_of(request).chat.count_tokens(messages_request(body), key)}


def _sse(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


async def _events(call: ChatCall, tokenizer: Any, model: str) -> AsyncIterator[str]:
    """Anthropic's event stream: message_start, ping, the text block (start, text deltas, stop), each tool_use
    block (start, its input as one JSON delta, stop), message_delta (stop reason, usage), message_stop; an engine
    failure ends it with an error event."""
    text_open = False
    async with TokenStream(call, tokenizer) as stream:
        yield _sse("message_start", {"message": message_object(call, model, [], None)})
        yield _sse("ping", {})
        async for piece in stream.text():
            if not text_open:
                yield _sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
                text_open = True
            yield _sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece}})
        try:
            reply = stream.finish()
        except APIError as err:
            yield _sse("error", {"error": anthropic_error_body(err.message, err.status)["error"]})
            return
        text = reply.message.get("content") or ""
        index = 0
        if text or text_open:
            if not text_open:
                yield _sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            if rest := stream.rest(text):
                yield _sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": rest}})
            yield _sse("content_block_stop", {"index": 0})
            index = 1
        for i, tc in enumerate(reply.message.get("tool_calls") or [], start=index):
            block = _tool_use(tc)
            yield _sse("content_block_start", {"index": i, "content_block": {**block, "input": {}}})
            yield _sse("content_block_delta", {"index": i, "delta": {"type": "input_json_delta",
                                                                     "partial_json": json.dumps(block["input"])}})
            yield _sse("content_block_stop", {"index": i})
        stop, sequence = stop_of(call, reply)
        yield _sse("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": sequence},
                                     "usage": {"output_tokens": len(reply.result.token_ids)}})
        yield _sse("message_stop", {})
