"""A call's generation for a streamed answer, whatever the API: the text released token by token as it is
produced, then the reply (recorded). Text is held back while it could still be the start of a stop string, and
entirely when tools are given (tool calls are parsed from the whole output). The host work per token is
incremental: the detokenizer decodes a few tokens, and stop strings are looked for in the held-back text. Each
API's route renders the pieces as its own events (chat chunks, Responses events, Messages events)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from agentjet.engines.base import GenerationResult
from agentjet.engines.detokenize import IncrementalDetokenizer
from agentjet.server.episodes.chat_call import ChatCall, Reply, engine_error


class TokenStream:
    """``async with TokenStream(call, tokenizer) as s``: the call is in flight and generating; ``s.text()``
    yields the text to send; ``s.finish()`` then gives the reply (or raises the engine's failure as an
    ``APIError``); ``s.rest(content)`` is what of the reply's content was not sent yet. Leaving the block (also
    when the client went away mid-stream) ends the call and leaves no task pending."""

    def __init__(self, call: ChatCall, tokenizer: Any) -> None:
        self.call = call
        self.sampling = call.sampling[0]
        self._tokenizer = tokenizer
        self._queue: asyncio.Queue[int] = asyncio.Queue()
        self._sent: list[str] = []
        self._task: asyncio.Future[GenerationResult] | None = None
        self._getter: asyncio.Future[int] | None = None

    async def __aenter__(self) -> TokenStream:
        self.call.begin()
        self._task = asyncio.ensure_future(self.call.generate(on_token=lambda t, _lp: self._queue.put_nowait(t)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.call.end()
        for pending in (self._getter, self._task):
            if pending is not None and not pending.done():
                pending.cancel()

    async def text(self) -> AsyncIterator[str]:
        """The text to send, piece by piece, until the generation ends."""
        task = self._task
        assert task is not None, "use TokenStream as an async context manager"
        stop = self.sampling.stop
        hold = max((len(s) for s in stop), default=1) - 1
        detok = IncrementalDetokenizer(self._tokenizer)
        held = ""  # released by the detokenizer, not sent yet
        stopped = False  # a stop string was found: nothing after it is sent
        while not (task.done() and self._queue.empty()):
            self._getter = getter = asyncio.ensure_future(self._queue.get())
            pending: set[asyncio.Future[Any]] = {getter, task}
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                self._getter = None
                continue
            piece = detok.push(getter.result())
            if self.call.parse_tools or stopped or not piece:
                continue
            held += piece
            out = held
            if stop:
                # a stop string the new piece completes starts inside the held-back text
                hits = [i for s in stop if (i := held.find(s)) >= 0]
                if hits:
                    out, stopped = held[: min(hits)], True
                else:
                    out = held[: max(0, len(held) - hold)]
            held = held[len(out):]
            if out:
                self._sent.append(out)
                yield out

    def result(self) -> GenerationResult:
        """The engine's result (its failure as an ``APIError``)."""
        assert self._task is not None
        try:
            return self._task.result()
        except Exception as exc:
            raise engine_error(exc) from exc

    def finish(self) -> Reply:
        """The reply, recorded on the episode."""
        return self.call.reply(self.result(), self.sampling)

    def rest(self, content: str | None) -> str:
        """What of ``content`` (the reply's) was not sent as text yet."""
        shown, text = "".join(self._sent), content or ""
        return text[len(shown):] if text.startswith(shown) else ""
