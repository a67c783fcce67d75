"""``POST /v1/completions``: OpenAI's legacy completions (a prompt in; text and logprobs out) on the one chat
call. There are no messages and no chat template: the prompt's token ids (a string's tokenization, or the ids as
given) go through the same generation and recording path. ``echo`` puts the prompt before the text; with
``logprobs`` the prompt's tokens are scored by the learner (teacher forcing: the current policy's logprob of each
prompt token after the first), and ``max_tokens: 0`` with ``echo`` only scores (nothing is generated or
recorded)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from agentjet.engines.base import MAX_SEED, GenerationResult
from agentjet.protocol import AGENT_HEADER
from agentjet.server.episodes.chat_call import Api, CallRequest, ChatCall
from agentjet.server.errors import APIError, bad_request, error_body
from agentjet.server.http.deps import EchoJSONResponse, bearer, server_of
from agentjet.server.http.openai_api import refuse_penalties
from agentjet.server.http.streaming import TokenStream

router = APIRouter(prefix="/v1")


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = Field(default=None, max_length=200)
    prompt: str | list[Any]
    max_tokens: int | None = Field(default=None, ge=0, le=2**31 - 1)  # 0: only with echo (scoring)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=2**31 - 1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, lt=MAX_SEED)
    n: int = Field(default=1, ge=1, le=16)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool | None = False
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    best_of: int | None = None
    suffix: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None


def prompt_ids(prompt: str | list[Any], tokenizer: Any) -> list[int]:
    """One prompt: a string (tokenized as the tokenizer does by default) or token ids; a list of one of those."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("the prompt is empty", param="prompt")
        try:
            return list(tokenizer.encode(prompt))
        except (TypeError, ValueError) as exc:  # e.g. a lone surrogate the Rust tokenizer refuses
            raise bad_request(f"the prompt cannot be tokenized: {exc}", param="prompt") from exc
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    raise bad_request("prompt must be one string or one list of token ids (send one request per prompt)",
                      param="prompt")


def completion_request(body: CompletionRequest, ids: list[int]) -> CallRequest:
    refuse_penalties(body.presence_penalty, body.frequency_penalty, body.logit_bias)
    if body.suffix:
        raise bad_request("suffix is not supported", param="suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise bad_request("best_of is not supported (it would train on choices the client never saw)",
                          param="best_of")
    if body.stream and body.n > 1:
        raise bad_request("stream with n > 1 is not supported; send n separate requests", param="n")
    if body.max_tokens == 0 and not (body.echo and body.logprobs is not None):
        raise bad_request("max_tokens must be at least 1 (0 only with echo and logprobs: scoring the prompt)",
                          param="max_tokens")
    return CallRequest(
        Api.COMPLETIONS, prompt_ids=ids, model=body.model, temperature=body.temperature, top_p=body.top_p,
        top_k=body.top_k, max_tokens=body.max_tokens or None, stop=body.stop, seed=body.seed, n=body.n,
        logprobs=body.logprobs is not None, top_logprobs=body.logprobs, stream=bool(body.stream))


class CompletionView:
    """Legacy logprobs (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``) and choices."""

    def __init__(self, call: ChatCall, body: CompletionRequest, tokenizer: Any, model: str,
                 prompt_text: str) -> None:
        self.call, self.body, self.tokenizer, self.model = call, body, tokenizer, model
        self.echo = prompt_text if body.echo else ""
        self.prompt_scores: list[float] | None = None  # with echo and logprobs: the prompt's

    def piece(self, token: int) -> str:
        return str(self.tokenizer.decode([token]))

    def logprobs(self, result: GenerationResult | None) -> dict[str, Any] | None:
        if self.body.logprobs is None:
            return None
        tokens: list[str] = []
        lps: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        if self.echo and self.prompt_scores is not None:
            ids = self.call.prompt_ids
            tokens += [self.piece(t) for t in ids]
            lps += [None, *self.prompt_scores]
            # a prompt position is scored by teacher forcing: its own token only, no alternatives
            tops += [None, *({self.piece(t): lp} for t, lp in zip(ids[1:], self.prompt_scores, strict=True))]
        if result is not None:
            alternatives = result.top_logprobs or [[] for _ in result.token_ids]
            for t, lp, top in zip(result.token_ids, result.logprobs, alternatives, strict=True):
                tokens.append(self.piece(t))
                lps.append(lp)
                tops.append({self.piece(a): alp for a, alp in top})
        offsets, at = [], 0
        for tok in tokens:
            offsets.append(at)
            at += len(tok)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}

    def usage(self, results: list[GenerationResult]) -> dict[str, int]:
        prompt, generated = len(self.call.prompt_ids), sum(len(r.token_ids) for r in results)
        return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}

    def answer(self, choices: list[dict[str, Any]], usage: dict[str, int] | None, version: int) -> dict[str, Any]:
        out = {"id": self.call.id, "object": "text_completion", "created": self.call.created, "model": self.model,
               "choices": choices, "system_fingerprint": f"policy-v{version}"}
        if usage is not None:
            out["usage"] = usage
        return out


@router.post("/completions", response_model=None)
async def create_completion(request: Request, body: CompletionRequest, key: str | None = Depends(bearer)) -> Any:
    server = server_of(request)
    tokenizer = server.engine.tokenizer
    ids = prompt_ids(body.prompt, tokenizer)
    call = await server.chat.open(completion_request(body, ids), key, request.headers.get(AGENT_HEADER))
    text = body.prompt if isinstance(body.prompt, str) else tokenizer.decode(ids, skip_special_tokens=False)
    view = CompletionView(call, body, tokenizer, server.config.name, text)
    if body.echo and body.logprobs is not None:
        view.prompt_scores = await call.prompt_logprobs()
    if body.max_tokens == 0:  # scoring only
        choice = {"index": 0, "text": view.echo, "logprobs": view.logprobs(None), "finish_reason": "length"}
        return EchoJSONResponse(view.answer([choice], view.usage([]), server.engine.generator_version))
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_stream(view, include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    replies = await call.complete()
    choices = [{"index": i, "text": view.echo + (r.message["content"] or ""), "logprobs": view.logprobs(r.result),
                "finish_reason": r.result.finish_reason.value} for i, r in enumerate(replies)]
    return EchoJSONResponse(view.answer(choices, view.usage([r.result for r in replies]),
                                    replies[0].result.policy_version))


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _stream(view: CompletionView, include_usage: bool) -> AsyncIterator[str]:
    def chunk(text: str, finish: str | None = None, logprobs: dict[str, Any] | None = None) -> str:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return _sse(view.answer([choice], None, view.call.engine.generator_version))

    async with TokenStream(view.call, view.tokenizer) as stream:
        if view.echo:
            yield chunk(view.echo)
        async for piece in stream.text():
            yield chunk(piece)
        try:
            reply = stream.finish()
        except APIError as err:
            yield _sse(error_body(err.message, err.type, err.param, err.code))
            return
        yield chunk(stream.rest(reply.message["content"]), reply.result.finish_reason.value,
                    view.logprobs(reply.result))
        if include_usage:
            yield _sse({**view.answer([], view.usage([reply.result]), reply.result.policy_version)})
        yield "data: [DONE]\n\n"
