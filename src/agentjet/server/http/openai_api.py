"""OpenAI-compatible ``/v1`` routes. The bearer key is the episode key; every call is recorded. A route parses
the request, opens the call (``server/episodes/chat_call.py``: validation, token-in/token-out, generation,
recording) and renders the OpenAI-shaped answer or server-sent events."""

from __future__ import annotations

import asyncio
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

from agentjet.engines.base import GenerationResult
from agentjet.engines.detokenize import IncrementalDetokenizer
from agentjet.protocol import AGENT_HEADER
from agentjet.server.episodes.chat_call import ChatCall, ChatCompletionRequest, engine_error
from agentjet.server.errors import error_body
from agentjet.server.http.deps import bearer, server_of
from agentjet.server.views.run_state import adapter_statuses, versions

router = APIRouter(prefix="/v1")


class CallView:
    """How one call's results are shown: logprobs, usage, and the stream's chunks."""

    def __init__(self, call: ChatCall, tokenizer: Any, model: str) -> None:
        self.call = call
        self.tokenizer = tokenizer
        self.model = model

    def logprobs(self, result: GenerationResult) -> ChoiceLogprobs | None:
        if not self.call.body.logprobs:
            return None

        def entry(token: int, logprob: float) -> dict[str, Any]:
            piece = self.tokenizer.decode([token])
            return {"token": piece, "logprob": logprob, "bytes": list(piece.encode())}

        tops = result.top_logprobs or [[] for _ in result.token_ids]
        content = [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in top]}
                   for t, lp, top in zip(result.token_ids, result.logprobs, tops, strict=True)]
        return ChoiceLogprobs.model_validate({"content": content})

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
    call = await server.chat.open(body, key, request.headers.get(AGENT_HEADER))
    if body.stream:
        return StreamingResponse(_stream(call, server.engine.tokenizer, server.config.name),
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


async def _stream(p: ChatCall, tokenizer: Any, model: str) -> AsyncIterator[str]:
    """Token-by-token SSE. Text is held back while it could still be the start of a stop string, and
    entirely when tools are given (tool calls are parsed from the whole output). The host work per token is
    incremental: the detokenizer decodes a few tokens, and stop strings are looked for in the held-back text."""
    sampling = p.sampling[0]
    queue: asyncio.Queue[int] = asyncio.Queue()
    detok = IncrementalDetokenizer(tokenizer)
    sent: list[str] = []
    held = ""  # released by the detokenizer, not sent yet
    stopped = False  # a stop string was found: nothing after it is sent
    hold = max((len(s) for s in sampling.stop), default=1) - 1
    view = CallView(p, tokenizer, model)
    chunk = view.chunk

    p.begin()
    task = asyncio.ensure_future(p.generate(on_token=lambda t, _lp: queue.put_nowait(t)))
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
        reply = p.reply(result, sampling)
        msg = reply.message
        shown = "".join(sent)
        rest = (msg["content"] or "")[len(shown):] if (msg["content"] or "").startswith(shown) else ""
        delta: dict[str, Any] = {}
        if rest:
            delta["content"] = rest
        if msg.get("tool_calls"):
            delta["tool_calls"] = [{**tc, "index": i} for i, tc in enumerate(msg["tool_calls"])]
        yield chunk(delta, reply.finish_reason, view.logprobs(result))
        if (p.body.stream_options or {}).get("include_usage"):
            yield chunk(None, usage=view.usage([result]))
        yield "data: [DONE]\n\n"
    finally:  # also when the client went away mid-stream: leave no task pending
        p.end()
        for pending in (getter, task):
            if pending is not None and not pending.done():
                pending.cancel()
