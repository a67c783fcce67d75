"""OpenAI-compatible ``/v1`` routes: ``/v1/models`` and ``/v1/chat/completions``. The bearer key is the episode
key; every call is recorded. The route parses its body into the API-neutral ``CallRequest``, opens the call
(``server/episodes/chat_call.py``: validation, token-in/token-out, generation, recording) and renders the
OpenAI-shaped answer or server-sent events. The other APIs on the same call: ``responses_api.py``,
``anthropic_api.py``, ``completions_api.py``."""

from __future__ import annotations

import json
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

from agentjet.engines.base import MAX_SEED, GenerationResult
from agentjet.protocol import AGENT_HEADER
from agentjet.server.episodes.chat_call import Api, CallRequest, ChatCall
from agentjet.server.errors import APIError, bad_request, error_body
from agentjet.server.http.deps import bearer, server_of
from agentjet.server.http.streaming import TokenStream
from agentjet.server.views.run_state import adapter_statuses, versions

router = APIRouter(prefix="/v1")


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = Field(default=None, max_length=200)
    messages: list[Any]
    tools: list[Any] | None = None
    tool_choice: Any = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=2**31 - 1)  # and at most the vocabulary (checked by the call)
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


def refuse_penalties(presence: float | None, frequency: float | None, logit_bias: dict[str, Any] | None) -> None:
    """What would change the sampling distribution the trainer reproduces (chat and legacy completions)."""
    if presence or frequency:
        raise bad_request("presence_penalty and frequency_penalty are not supported: they would change the "
                          "sampling distribution the trainer reproduces", param="presence_penalty")
    if logit_bias:
        raise bad_request("logit_bias is not supported", param="logit_bias")


def chat_request(body: ChatCompletionRequest) -> CallRequest:
    """The chat completion's body as the call's request (what it cannot honour refused with a 400)."""
    refuse_penalties(body.presence_penalty, body.frequency_penalty, body.logit_bias)
    if body.response_format and body.response_format.get("type", "text") != "text":
        raise bad_request("only response_format {'type': 'text'} is supported", param="response_format")
    if body.stream and body.n > 1:
        raise bad_request("stream with n > 1 is not supported; send n separate requests", param="n")
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs requires logprobs: true", param="top_logprobs")
    return CallRequest(
        Api.CHAT, messages=body.messages, tools=body.tools, tool_choice=body.tool_choice, model=body.model,
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
        max_tokens=body.max_completion_tokens or body.max_tokens, stop=body.stop, seed=body.seed, n=body.n,
        logprobs=bool(body.logprobs), top_logprobs=body.top_logprobs, stream=bool(body.stream))


def token_logprobs(tokenizer: Any, result: GenerationResult) -> list[dict[str, Any]]:
    """OpenAI's per-token logprobs of a result (chat's ``logprobs.content``, Responses' ``output_text.logprobs``)."""
    def entry(token: int, logprob: float) -> dict[str, Any]:
        piece = tokenizer.decode([token])
        return {"token": piece, "logprob": logprob, "bytes": list(piece.encode())}

    tops = result.top_logprobs or [[] for _ in result.token_ids]
    return [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in top]}
            for t, lp, top in zip(result.token_ids, result.logprobs, tops, strict=True)]


class CallView:
    """How one call's results are shown: logprobs, usage, and the stream's chunks."""

    def __init__(self, call: ChatCall, tokenizer: Any, model: str) -> None:
        self.call = call
        self.tokenizer = tokenizer
        self.model = model

    def logprobs(self, result: GenerationResult) -> ChoiceLogprobs | None:
        if not self.call.request.logprobs:
            return None
        return ChoiceLogprobs.model_validate({"content": token_logprobs(self.tokenizer, result)})

    def usage(self, results: list[GenerationResult]) -> CompletionUsage:
        prompt = len(self.call.prompt_ids)
        completion = sum(len(r.token_ids) for r in results)
        return CompletionUsage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    def chunk(self, delta: dict[str, Any] | None, finish: str | None = None, logprobs: ChoiceLogprobs | None = None,
              usage: CompletionUsage | None = None) -> str:
        """One server-sent event of the stream (``delta=None``: the final usage-only chunk)."""
        chunk_logprobs = None if logprobs is None else ChunkLogprobs.model_validate(logprobs.model_dump())
        choices = [] if delta is None else [ChunkChoice.model_validate(
            {"index": 0, "delta": ChoiceDelta.model_validate(delta), "finish_reason": finish,
             "logprobs": chunk_logprobs})]
        event = ChatCompletionChunk(id=self.call.id, object="chat.completion.chunk", created=self.call.created,
                                    model=self.model, choices=choices, usage=usage)
        return _sse(event.model_dump(mode="json", exclude_unset=True))


@router.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    """The served model; with several LoRA adapters, each adapter too (its name is the ``model`` a call names)."""
    server = server_of(request)
    models = [{"id": server.config.name, "object": "model", "created": 0, "owned_by": "agentjet",
               "policy_version": versions(server.run).served}]
    models += [{"id": name, "object": "model", "created": 0, "owned_by": "agentjet", "parent": server.config.name,
                "policy_version": adapter.policy_version} for name, adapter in adapter_statuses(server.run).items()]
    return {"object": "list", "data": models}


@router.post("/chat/completions", response_model=None)
async def chat_completions(request: Request, body: ChatCompletionRequest, key: str | None = Depends(bearer)) -> Any:
    server = server_of(request)
    call = await server.chat.open(chat_request(body), key, request.headers.get(AGENT_HEADER))
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_stream(call, server.engine.tokenizer, server.config.name, include_usage),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    replies = await call.complete()
    view = CallView(call, server.engine.tokenizer, server.config.name)
    choices = [Choice.model_validate({"index": i, "message": ChatCompletionMessage.model_validate(r.message),
                                      "finish_reason": r.finish_reason, "logprobs": view.logprobs(r.result)})
               for i, r in enumerate(replies)]
    completion = ChatCompletion(id=call.id, object="chat.completion", created=call.created, model=server.config.name,
                                choices=choices, usage=view.usage([r.result for r in replies]),
                                system_fingerprint=f"policy-v{replies[0].result.policy_version}")
    return JSONResponse(completion.model_dump(mode="json", exclude_unset=True))


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _stream(p: ChatCall, tokenizer: Any, model: str, include_usage: bool) -> AsyncIterator[str]:
    """Token-by-token SSE (``TokenStream``): the role chunk, the content chunks, then the last chunk with the
    rest of the reply (tool calls, when parsed) and its finish reason; an engine failure ends the stream with an
    error event."""
    view = CallView(p, tokenizer, model)
    chunk = view.chunk
    async with TokenStream(p, tokenizer) as stream:
        yield chunk({"role": "assistant", "content": ""})
        async for out in stream.text():
            yield chunk({"content": out})
        try:
            reply = stream.finish()
        except APIError as err:
            yield _sse(error_body(err.message, err.type, err.param, err.code))
            return
        msg = reply.message
        delta: dict[str, Any] = {}
        if rest := stream.rest(msg["content"]):
            delta["content"] = rest
        if msg.get("tool_calls"):
            delta["tool_calls"] = [{**tc, "index": i} for i, tc in enumerate(msg["tool_calls"])]
        yield chunk(delta, reply.finish_reason, view.logprobs(reply.result))
        if include_usage:
            yield chunk(None, usage=view.usage([reply.result]))
        yield "data: [DONE]\n\n"
