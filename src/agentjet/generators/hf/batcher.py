"""The request batcher shared by engines: concurrent ``generate`` calls are gathered (up to ``max_batch_size``,
within ``wait_s``) and handed to the engine's ``run_batch`` together.

Failure isolation (invariant 4: one client's bad request never fails another's): when a batch raises, each of
its requests is run again on its own, so only the request that caused the failure gets the error. A request
whose stream already delivered tokens is not re-run (its tokens were sent); it gets the error too.
Client mistakes (``GenerationError``) are logged on one line, engine failures with their traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agentjet.engines.base import GenerationError, GenerationResult, SamplingParams, TokenCallback

log = logging.getLogger(__name__)


@dataclass
class Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future[GenerationResult]
    on_token: TokenCallback | None = None
    emitted: int = 0  # tokens handed to on_token so far
    adapter: str | None = None  # the LoRA adapter that generates it (None: the generator's only policy)

    def emit(self, token: int, logprob: float) -> None:
        """Hand a token to the caller's callback. Thread-safe: may be called from the engine's worker thread."""
        if self.on_token is not None and not self.future.done():
            self.emitted += 1
            self.future.get_loop().call_soon_threadsafe(self.on_token, token, logprob)

    @property
    def waiting(self) -> bool:
        return not self.future.done()


# The engine's batch function: one result per request, in order. An exception in the list fails that request
# alone (e.g. a request refused while it was prepared); an exception raised fails the batch (isolated below).
RunBatch = Callable[[list[Request]], Awaitable[list[GenerationResult | Exception]]]


class RequestBatcher:
    def __init__(self, run_batch: RunBatch, max_batch_size: int, wait_s: float) -> None:
        self.run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s
        self._queue: asyncio.Queue[Request] | None = None
        self._task: asyncio.Task[None] | None = None
        self.stats = {"batches": 0, "requests": 0, "isolated_failures": 0}

    async def submit(self, prompt_ids: list[int], sampling: SamplingParams,
                     on_token: TokenCallback | None = None) -> GenerationResult:
        loop = asyncio.get_running_loop()
        if self._queue is None or self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._queue = asyncio.Queue()  # (re)start on the current event loop
            self._task = loop.create_task(self._loop())
        fut: asyncio.Future[GenerationResult] = loop.create_future()
        await self._queue.put(Request(list(prompt_ids), sampling, fut, on_token))
        return await fut

    async def _gather(self, queue: asyncio.Queue[Request]) -> list[Request]:
        loop = asyncio.get_running_loop()
        batch = [await queue.get()]
        deadline = loop.time() + self.wait_s
        while len(batch) < self.max_batch_size:
            timeout = deadline - loop.time()
            if timeout <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), timeout))
            except TimeoutError:
                break
        while len(batch) < self.max_batch_size and not queue.empty():
            batch.append(queue.get_nowait())
        return [r for r in batch if r.waiting]

    async def _loop(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            batch = await self._gather(queue)
            if batch:
                await self._serve(batch)

    async def _serve(self, batch: list[Request]) -> None:
        self.stats["batches"] += 1
        self.stats["requests"] += len(batch)
        try:
            results = await self.run_batch(batch)
        except Exception as exc:
            if len(batch) == 1:
                _fail(batch[0], exc)
                return
            log.warning("a batch of %d requests failed (%s); running each on its own", len(batch), _brief(exc))
            self.stats["isolated_failures"] += 1
            for r in batch:
                if r.emitted:  # tokens already streamed: a re-run would repeat them
                    _fail(r, exc)
                elif r.waiting:
                    await self._serve([r])
            return
        for r, res in zip(batch, results, strict=True):
            if isinstance(res, Exception):
                _fail(r, res)
            elif r.waiting:
                r.future.set_result(res)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._task = None
        self._queue = None


def _brief(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _fail(r: Request, exc: Exception) -> None:
    if isinstance(exc, GenerationError):
        log.error("generation request refused: %s", exc)
    else:
        log.error("generation failed", exc_info=exc)
    if r.waiting:
        r.future.set_exception(exc)
