"""OpenAI-compatible ``/v1`` routes. The bearer key is the episode key; every call is recorded."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from openai.types.chat.chat_completion_chunk import ChoiceLogprobs as ChunkLogprobs
from openai.types.completion_usage import CompletionUsage
from pydantic import BaseModel, ConfigDict, Field

from agentjet.engines.base import MAX_SEED, GenerationResult, SamplingParams
from agentjet.engines.detokenize import IncrementalDetokenizer
from agentjet.engines.errors import EngineUnavailableError, GenerationError
from agentjet.protocol import AGENT_HEADER, DEFAULT_AGENT
from agentjet.server.chat import (
    ChatFormatError,
    normalize_messages,
    validate_tool_choice,
    validate_tools,
)
from agentjet.server.errors import APIError, bad_request, conflict, error_body, unavailable
from agentjet.server.registry import Episode
from agentjet.server.routes import bearer, server_of
from agentjet.server.swarm import SwarmServer
from agentjet.tracking import CallRecord

router = APIRouter(prefix="/v1")


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = Field(default=None, max_length=200)
    messages: list[Any]
    tools: list[Any] | None = None
    tool_choice: Any = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=2**31 - 1)  # and at most the vocabulary (checked below)
    max_tokens: int | None = Field(default=None, ge=1, le=2**31 - 1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=2**31 - 1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, lt=MAX_SEED)
    n: int = Field(default=1, ge=1, le=16)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


MAX_STOP_CHARS = 1000


def agent_name(request: Request, body: ChatCompletionRequest, server: SwarmServer) -> str:
    header = request.headers.get(AGENT_HEADER)
    if header:
        name = header.strip()
    elif body.model and body.model not in (server.config.name, server.config.model, DEFAULT_AGENT):
        name = body.model
    else:
        name = DEFAULT_AGENT
    if not name or len(name) > 200:
        raise bad_request("the agent name must be 1 to 200 characters", param="model")
    return name


def _unsupported(body: ChatCompletionRequest) -> None:
    if body.presence_penalty or body.frequency_penalty:
        raise bad_request("presence_penalty and frequency_penalty are not supported: they would change the "
                          "sampling distribution the trainer reproduces", param="presence_penalty")
    if body.logit_bias:
        raise bad_request("logit_bias is not supported", param="logit_bias")
    if body.response_format and body.response_format.get("type", "text") != "text":
        raise bad_request("only response_format {'type': 'text'} is supported", param="response_format")
    if body.stream and body.n > 1:
        raise bad_request("stream with n > 1 is not supported; send n separate requests", param="n")
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs requires logprobs: true", param="top_logprobs")


def sampling_for(body: ChatCompletionRequest, server: SwarmServer, prompt_len: int, index: int) -> SamplingParams:
    d = server.config.sampling
    room = server.engine.max_context - prompt_len
    if room < 1:
        raise bad_request(f"the prompt has {prompt_len} tokens, which fills the model's context of "
                          f"{server.engine.max_context} tokens", param="messages", code="context_length_exceeded")
    asked = body.max_completion_tokens or body.max_tokens
    if asked is not None and asked > room:
        raise bad_request(f"max_tokens={asked} plus the prompt's {prompt_len} tokens exceeds the model's context of "
                          f"{server.engine.max_context} tokens (at most {room})", param="max_tokens",
                          code="context_length_exceeded")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if len(stop) > 4 or any(not s or len(s) > MAX_STOP_CHARS for s in stop):
        raise bad_request(f"stop must be up to 4 non-empty strings of at most {MAX_STOP_CHARS} characters",
                          param="stop")
    vocab = len(server.engine.tokenizer)
    if body.top_k and body.top_k > vocab:
        raise bad_request(f"top_k must be at most the vocabulary size {vocab} (got {body.top_k})", param="top_k")
    return SamplingParams(
        temperature=body.temperature if body.temperature is not None else d.temperature,
        top_p=body.top_p if body.top_p is not None else d.top_p,
        top_k=body.top_k or 0,
        max_tokens=asked or min(d.max_tokens, room),
        stop=stop,
        seed=None if body.seed is None else (body.seed + index) % MAX_SEED,
        top_logprobs=(body.top_logprobs or 0) if body.logprobs else 0,
    )


class ChatCall:
    """One chat completion request, validated against its episode and rendered to prompt ids (with token-in,
    token-out applied: ``ChatCall.create``), plus what it needs to record each reply and shape the answer."""

    def __init__(self, request: Request, body: ChatCompletionRequest, key: str | None) -> None:
        server = server_of(request)
        self.server = server
        self.episode: Episode = server.keys.open_by_key(key)
        _unsupported(body)
        if len(body.messages) > server.config.max_messages:
            raise bad_request(f"at most {server.config.max_messages} messages per request", param="messages")
        self.body = body
        self.agent = agent_name(request, body, server)
        try:
            self.messages = normalize_messages(body.messages)
            self.tools = validate_tools(body.tools)
            validate_tool_choice(body.tool_choice, self.tools)
            self.prompt_ids = server.formatter.prompt_ids(self.messages, self.tools)
        except ChatFormatError as exc:
            raise bad_request(str(exc), param=exc.param) from exc
        self.sampling = [sampling_for(body, server, len(self.prompt_ids), i) for i in range(body.n)]
        self.parse_tools = bool(self.tools) and body.tool_choice != "none"
        self.created = int(time.time())
        self.id = "chatcmpl-" + uuid.uuid4().hex

    @classmethod
    async def create(cls, request: Request, body: ChatCompletionRequest, key: str | None) -> ChatCall:
        """Validate, then put this agent's earlier generations back into the prompt as generated (token-in,
        token-out; ``agentjet.server.tito``)."""
        p = cls(request, body, key)
        ids = await p.server.ingest.tito_prompt_ids(p.episode, p.agent, p.messages, p.tools, p.prompt_ids)
        if ids is not p.prompt_ids:
            p.prompt_ids = ids
            p.sampling = [sampling_for(body, p.server, len(ids), i) for i in range(body.n)]
        return p

    def assistant_message(self, result: GenerationResult) -> dict[str, Any]:
        content, tool_calls = self.server.formatter.parse_reply(result.text, result.token_ids, self.parse_tools)
        msg: dict[str, Any] = {"role": "assistant", "content": content if (content or not tool_calls) else None}
        if tool_calls:
            msg["tool_calls"] = tool_calls
        return msg

    def record(self, result: GenerationResult, message: dict[str, Any], sampling: SamplingParams) -> None:
        # Record what the template really rendered (tools folded into messages where the template has no
        # tool support), so that context tracking re-renders exactly these prompt ids.
        fmt = self.server.formatter
        messages, tools = fmt.as_rendered(self.messages, self.tools)
        reply = fmt.render_messages(normalize_messages([message]), None)[0]
        call = CallRecord(
            call_index=len(self.episode.calls), agent=self.agent, messages=messages, tools=tools,
            prompt_ids=self.prompt_ids, completion_ids=list(result.token_ids),
            completion_logprobs=list(result.logprobs), temperature=sampling.logprob_temperature,
            policy_version=result.policy_version, response_message=reply,
            finish_reason=result.finish_reason.value, completion_versions=result.versions)
        self.server.ingest.record_call(self.episode, call)

    def finish_reason(self, result: GenerationResult, message: dict[str, Any]) -> str:
        return "tool_calls" if message.get("tool_calls") else result.finish_reason.value

    def logprobs(self, result: GenerationResult) -> ChoiceLogprobs | None:
        if not self.body.logprobs:
            return None
        tok = self.server.engine.tokenizer

        def entry(token: int, logprob: float) -> dict[str, Any]:
            piece = tok.decode([token])
            return {"token": piece, "logprob": logprob, "bytes": list(piece.encode())}

        tops = result.top_logprobs or [[] for _ in result.token_ids]
        content = [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in top]}
                   for t, lp, top in zip(result.token_ids, result.logprobs, tops, strict=True)]
        return ChoiceLogprobs.model_validate({"content": content})

    def usage(self, results: list[GenerationResult]) -> CompletionUsage:
        completion = sum(len(r.token_ids) for r in results)
        return CompletionUsage(prompt_tokens=len(self.prompt_ids), completion_tokens=completion,
                               total_tokens=len(self.prompt_ids) + completion)

    def chunk(self, delta: dict[str, Any] | None, finish: str | None = None, logprobs: ChoiceLogprobs | None = None,
              usage: CompletionUsage | None = None) -> str:
        """One server-sent event of the stream (``delta=None``: the final usage-only chunk)."""
        chunk_logprobs = None if logprobs is None else ChunkLogprobs.model_validate(logprobs.model_dump())
        choices = [] if delta is None else [ChunkChoice(index=0, delta=ChoiceDelta.model_validate(delta),
                                                        finish_reason=finish, logprobs=chunk_logprobs)]
        event = ChatCompletionChunk(id=self.id, object="chat.completion.chunk", created=self.created,
                                    model=self.server.config.name, choices=choices, usage=usage)
        return _sse(event.model_dump(mode="json", exclude_unset=True))


def _begin_call(p: ChatCall) -> None:
    p.episode.inflight += 1
    p.server.registry.touch(p.episode)


def _end_call(p: ChatCall) -> None:
    p.episode.inflight -= 1
    p.server.registry.touch(p.episode)


def engine_error(exc: Exception) -> APIError:
    """An engine failure as an HTTP error: the request's own fault is a 400 naming its parameter; anything
    else is the engine's (503, retry later), never a 500."""
    if isinstance(exc, GenerationError):
        return bad_request(str(exc), param=exc.param)
    if isinstance(exc, ValueError):
        return bad_request(str(exc), param="messages")
    if isinstance(exc, EngineUnavailableError):  # e.g. the vLLM subprocess crashed and is restarting
        return unavailable(f"the engine is unavailable: {exc}", "engine_unavailable",
                           retry_after_s=exc.retry_after_s if exc.retry_after_s is not None else 5)
    return unavailable(f"the engine failed on this request ({type(exc).__name__}); retry later", "engine_error",
                       retry_after_s=1)


@router.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    server = server_of(request)
    return {"object": "list", "data": [{"id": server.config.name, "object": "model", "created": 0,
                                        "owned_by": "agentjet", "policy_version": server.engine.policy_version}]}


@router.post("/chat/completions", response_model=None)
async def chat_completions(request: Request, body: ChatCompletionRequest, key: str | None = Depends(bearer)) -> Any:
    p = await ChatCall.create(request, body, key)
    if body.stream:
        return StreamingResponse(_stream(p), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    _begin_call(p)
    try:
        results = await asyncio.gather(*[p.server.engine.generate(p.prompt_ids, s) for s in p.sampling])
    except Exception as exc:
        raise engine_error(exc) from exc
    finally:
        _end_call(p)
    if not p.episode.is_open:
        raise conflict(f"episode {p.episode.episode_id} was {p.episode.status.value} during the call", "episode_closed")
    choices = []
    for i, (res, s) in enumerate(zip(results, p.sampling, strict=True)):
        msg = p.assistant_message(res)
        p.record(res, msg, s)
        choices.append(Choice(index=i, message=ChatCompletionMessage.model_validate(msg),
                              finish_reason=p.finish_reason(res, msg), logprobs=p.logprobs(res)))
    completion = ChatCompletion(id=p.id, object="chat.completion", created=p.created, model=p.server.config.name,
                                choices=choices, usage=p.usage(results),
                                system_fingerprint=f"policy-v{results[0].policy_version}")
    return JSONResponse(completion.model_dump(mode="json", exclude_unset=True))


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _stream(p: ChatCall) -> AsyncIterator[str]:
    """Token-by-token SSE. Text is held back while it could still be the start of a stop string, and
    entirely when tools are given (tool calls are parsed from the whole output). The host work per token is
    incremental: the detokenizer decodes a few tokens, and stop strings are looked for in the held-back text."""
    sampling = p.sampling[0]
    queue: asyncio.Queue[int] = asyncio.Queue()
    detok = IncrementalDetokenizer(p.server.engine.tokenizer)
    sent: list[str] = []
    held = ""  # released by the detokenizer, not sent yet
    stopped = False  # a stop string was found: nothing after it is sent
    hold = max((len(s) for s in sampling.stop), default=1) - 1
    chunk = p.chunk

    _begin_call(p)
    task = asyncio.ensure_future(p.server.engine.generate(p.prompt_ids, sampling,
                                                          on_token=lambda t, _lp: queue.put_nowait(t)))
    getter: asyncio.Future[int] | None = None
    try:
        yield chunk({"role": "assistant", "content": ""})
        while not (task.done() and queue.empty()):
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                getter = None
                continue
            piece = detok.push(getter.result())
            if p.parse_tools or stopped or not piece:
                continue
            held += piece
            out = held
            if sampling.stop:
                # a stop string the new piece completes starts inside the held-back text
                hits = [i for s in sampling.stop if (i := held.find(s)) >= 0]
                if hits:
                    out, stopped = held[: min(hits)], True
                else:
                    out = held[: max(0, len(held) - hold)]
            held = held[len(out):]
            if out:
                yield chunk({"content": out})
                sent.append(out)
        try:
            result = task.result()
        except Exception as exc:
            err = engine_error(exc)
            yield _sse(error_body(err.message, err.type, err.param, err.code))
            return
        msg = p.assistant_message(result)
        shown = "".join(sent)
        rest = (msg["content"] or "")[len(shown):] if (msg["content"] or "").startswith(shown) else ""
        delta: dict[str, Any] = {}
        if rest:
            delta["content"] = rest
        if msg.get("tool_calls"):
            delta["tool_calls"] = [{**tc, "index": i} for i, tc in enumerate(msg["tool_calls"])]
        if p.episode.is_open:
            p.record(result, msg, sampling)
        yield chunk(delta, p.finish_reason(result, msg), p.logprobs(result))
        if (p.body.stream_options or {}).get("include_usage"):
            yield chunk(None, usage=p.usage([result]))
        yield "data: [DONE]\n\n"
    finally:  # also when the client went away mid-stream: leave no task pending
        _end_call(p)
        for pending in (getter, task):
            if pending is not None and not pending.done():
                pending.cancel()
