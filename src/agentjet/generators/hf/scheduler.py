"""Continuous batching by slot refill.

A fixed pool of ``max_batch_size`` slots. Each unit of work on the engine's thread (``EngineWorker``):
1. admits queued requests into free slots: each is prepared on its own (a bad request fails alone, naming its
   parameter), then the joiners are prefilled together into their slots and sample their first token;
2. runs one decode step over the slots in use (``SlotRunner.decode``) and samples one token per row;
3. does the host work per token (stop ids, stop strings, the stream callback, top-logprobs); a row that
   finishes frees its slot at once and its caller gets its result.
So a queued request joins at the next decode step and no request waits for the longest one in its batch. The
lowest free slot is taken first, so the rows in use stay packed at the front and a step covers few unused slots.

When the engine is idle, the first request waits up to ``wait_s`` for others, so that a burst starts as one batch.

Isolation (invariant 4): a request that fails while prepared fails alone. When a prefill of several joiners
fails, each is prefilled again on its own. When a decode step fails, the rows that have not streamed a token yet
are queued again at the front, to be run one at a time (``solo``), and the rows that have streamed tokens fail
(their tokens were sent; a re-run would send others). A solo row that fails again fails.

Weights and train steps: a train step is a job on the same thread, so it runs between two decode steps and
updates the weights in place. Requests that arrive during it wait in the queue and are generated entirely by
the new weights. Rows already generating go on with the new weights: their earlier keys and values come from
the old ones, and each token's behaviour logprob is the exact probability it was sampled with. Every token
records the policy version of the step that sampled it (``policy_version(adapter)`` is read once per prefill
and once per decode step, for each adapter in it), so a reply that spans an update carries the version change
at the token where it happened; the result's ``policy_version`` is its first token's (the oldest weights that
touched it).

Kept prefixes: a row that finishes hands its keys and values to the runner's prefix cache (``prefix_cache.py``),
before its slot is freed, and a joiner whose prompt starts with a kept row's tokens prefills only the rest.

Named LoRA adapters: each request names its adapter (``Request.adapter``), each adapter has its own policy
version (``policy_version(adapter)``; an adapter the generator does not serve raises, and that request alone
fails), and rows of different adapters share prefills and decode steps (the runner passes each row's adapter).
``drop_adapter`` fails an adapter's queued and running requests when it is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from agentjet.engines.base import GenerationError, GenerationResult, SamplingParams, TokenCallback
from agentjet.engines.sampling import sample_next
from agentjet.engines.worker import EngineWorker, run_callbacks, settle
from agentjet.generators.hf.batcher import Request
from agentjet.generators.hf.rows import Row, RowRules, top_lists
from agentjet.generators.hf.runner import SlotRunner

log = logging.getLogger(__name__)


class Outbox:
    """What a unit of work hands back to the callers' event loops, in order: stream tokens, then results. One
    thread-safe wake-up per event loop per step, instead of one per token."""

    def __init__(self) -> None:
        self._items: dict[asyncio.AbstractEventLoop, list[Callable[[], None]]] = {}

    def token(self, req: Request, token: int, logprob: float) -> None:
        if req.on_token is None or req.future.done():
            return
        req.emitted += 1
        self._items.setdefault(req.future.get_loop(), []).append(functools.partial(req.on_token, token, logprob))

    def resolve(self, req: Request, outcome: GenerationResult | Exception) -> None:
        """Set the caller's future (on its own loop); nothing if the caller is gone."""
        fut = req.future
        if fut.done():
            return
        if isinstance(outcome, Exception):
            _log_failure(outcome)
        self._items.setdefault(fut.get_loop(), []).append(functools.partial(settle, fut, outcome))

    def flush(self) -> None:
        items, self._items = self._items, {}
        for loop, calls in items.items():
            with contextlib.suppress(RuntimeError):  # the caller's event loop is closed
                loop.call_soon_threadsafe(run_callbacks, calls)


@dataclass
class _Queued:
    req: Request
    arrived: float
    solo: bool = False  # run alone: it was in a decode step that failed


class ContinuousScheduler:
    def __init__(self, worker: EngineWorker, runner: SlotRunner, rules: RowRules,
                 policy_version: Callable[[str | None], int], wait_s: float) -> None:
        """``policy_version(adapter)``: the version that serves ``adapter``'s new tokens now (None: the only
        policy); it raises (a ``GenerationError``) for an adapter the generator does not serve."""
        self.worker = worker
        self.runner = runner
        self.rules = rules
        self.policy_version = policy_version
        self.wait_s = wait_s
        self.slots: list[Row | None] = [None] * runner.slots
        self._inbox: deque[_Queued] = deque()  # guarded by worker.cond
        self._solo = False  # a solo row holds the pool
        self.outbox = Outbox()
        self.stats = {"generate_batches": 0, "generate_requests": 0, "generated_tokens": 0, "decode_steps": 0,
                      "decode_rows": 0, "isolated_failures": 0, "requests": 0, "batches": 0,
                      "mixed_adapter_steps": 0,  # decode steps whose rows used two adapters or more
                      # wall time on the worker thread in admission (preparing and prefilling joiners) and in decode
                      # steps (sampling and the host sync included): against a run's wall time, what is left is
                      # time the thread spent elsewhere (idle, train jobs, waiting for the GIL)
                      "admit_us": 0, "decode_us": 0}
        worker.attach(self)

    # ------------------------------------------------------------------ the event loop's side
    async def submit(self, prompt_ids: list[int], sampling: SamplingParams,
                     on_token: TokenCallback | None = None, adapter: str | None = None) -> GenerationResult:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[GenerationResult] = loop.create_future()
        req = Request(list(prompt_ids), sampling, fut, on_token, adapter=adapter)
        self.worker.ensure_started()
        with self.worker.cond:
            self._inbox.append(_Queued(req, self.worker.clock.monotonic()))
            self.worker.cond.notify()
        return await fut  # cancelled with its caller: the row is dropped at the next step

    # ------------------------------------------------------------------ the worker's side
    @property
    def active(self) -> list[Row]:
        return [r for r in self.slots if r is not None]

    def pending(self, now: float) -> float | None:
        if any(r is not None for r in self.slots):
            return 0
        while self._inbox and not self._inbox[0].req.waiting:
            self._inbox.popleft()  # its caller went away
        if not self._inbox:
            return None
        head = self._inbox[0]
        if head.solo or len(self._inbox) >= len(self.slots):
            return 0
        return head.arrived + self.wait_s - now  # an idle engine waits a little for a burst to gather

    def step(self) -> None:
        start = time.perf_counter()
        try:
            self._drop_cancelled()
            self._admit()
            admitted = time.perf_counter()
            self.stats["admit_us"] += int((admitted - start) * 1e6)
            if any(r is not None for r in self.slots):
                self._decode()
                self.stats["decode_us"] += int((time.perf_counter() - admitted) * 1e6)
        finally:
            self.outbox.flush()

    def fail_all(self, exc: Exception) -> None:
        with self.worker.cond:
            queued, self._inbox = list(self._inbox), deque()
        for q in queued:
            self.outbox.resolve(q.req, exc)
        for i, row in enumerate(self.slots):
            if row is not None:
                self.outbox.resolve(row.req, exc)
                self.slots[i] = None
        self._solo = False
        self.runner.release(list(range(len(self.slots))))
        self.outbox.flush()

    def drop_adapter(self, adapter: str, exc: Exception) -> int:
        """Fail every request of ``adapter``, queued or generating, with ``exc`` (on the worker thread, between two
        steps: the adapter is being removed). The other rows go on. Returns how many requests failed."""
        with self.worker.cond:
            dropped = [q for q in self._inbox if q.req.adapter == adapter]
            self._inbox = deque(q for q in self._inbox if q.req.adapter != adapter)
        for q in dropped:
            self.outbox.resolve(q.req, exc)
        running = [r for r in self.active if r.adapter == adapter]
        self._fail_rows(running, exc)
        self.outbox.flush()
        return len(dropped) + len(running)

    # ------------------------------------------------------------------ admission
    def _take(self) -> list[_Queued]:
        free = sum(r is None for r in self.slots)
        taken: list[_Queued] = []
        with self.worker.cond:
            while self._inbox and len(taken) < free and not self._solo:
                head = self._inbox[0]
                if not head.req.waiting:
                    self._inbox.popleft()
                    continue
                if head.solo:
                    if taken or free < len(self.slots):
                        break  # a solo row waits for an empty pool
                    self._solo = True
                taken.append(self._inbox.popleft())
        return taken

    def _admit(self) -> None:
        taken = self._take()
        if not taken:
            return
        joiners: list[Row] = []
        free = [i for i, r in enumerate(self.slots) if r is None]
        for q in taken:
            try:
                row = self.rules.prepare(q.req, self.policy_version(q.req.adapter))
                self.runner.ensure_capacity(len(q.req.prompt_ids) + row.budget)
            except Exception as exc:  # noqa: BLE001 - this request alone (a GenerationError names its param)
                self.outbox.resolve(q.req, exc)
                if q.solo:
                    self._solo = False
                continue
            row.slot = free[len(joiners)]
            self.slots[row.slot] = row
            joiners.append(row)
        if joiners:
            self._prefill(joiners)

    def _prefill(self, joiners: list[Row]) -> None:
        try:
            logits = self._prefill_logits(joiners)
            self._first_tokens(joiners, logits)
        except Exception as exc:  # noqa: BLE001 - isolate: each joiner on its own
            if len(joiners) == 1:
                self._fail_rows(joiners, exc)
                return
            log.warning("a prefill of %d requests failed (%s: %s); prefilling each on its own", len(joiners),
                        type(exc).__name__, exc)
            self.stats["isolated_failures"] += 1
            for row in joiners:
                self._reset(row)
            for row in joiners:
                try:
                    self._first_tokens([row], self._prefill_logits([row]))
                except Exception as exc_one:  # noqa: BLE001
                    self._fail_rows([row], exc_one)

    def _prefill_logits(self, rows: list[Row]) -> torch.Tensor:
        """The joiners' next-token logits (the hook that tests poison to check isolation)."""
        return self.runner.prefill([r.slot for r in rows], [r.req.prompt_ids for r in rows],
                                   [r.adapter for r in rows])

    def _first_tokens(self, rows: list[Row], logits: torch.Tensor) -> None:
        self.stats["generate_batches"] += 1
        self.stats["batches"] += 1
        self.stats["generate_requests"] += len(rows)
        self.stats["requests"] += len(rows)
        self._sample_and_accept(rows, logits)

    # ------------------------------------------------------------------ decoding
    def _drop_cancelled(self) -> None:
        gone = [r for r in self.slots if r is not None and not r.req.waiting]
        for row in gone:
            self._free(row)

    def _decode(self) -> None:
        rows = self.active
        try:
            logits = self._decode_logits(rows)
            self._sample_and_accept(rows, logits)
        except Exception as exc:  # noqa: BLE001 - isolate what we must
            self._decode_failed(rows, exc)

    def _decode_logits(self, rows: list[Row]) -> torch.Tensor:
        """One decode step; the logits of ``rows`` (in slot order). The hook that tests poison."""
        hi = max(r.slot for r in rows) + 1
        logits = self.runner.decode(hi)
        self.stats["decode_steps"] += 1
        self.stats["decode_rows"] += len(rows)
        if len({r.adapter for r in rows}) > 1:
            self.stats["mixed_adapter_steps"] += 1
        if len(rows) == hi:
            return logits[:hi]
        return logits[torch.tensor([r.slot for r in rows], device=logits.device)]

    def _sample_and_accept(self, rows: list[Row], logits: torch.Tensor) -> None:
        # the weights that computed these logits, per adapter (they move only between steps)
        versions = {a: self.policy_version(a) for a in {r.adapter for r in rows}}
        params = [r.params for r in rows]
        tokens, lps, top = sample_next(logits, params, [r.generator for r in rows],
                                       max(p.top_logprobs for p in params))
        slot_index = torch.tensor([r.slot for r in rows], device=tokens.device)
        self.runner.set_next_tokens(slot_index, tokens)  # on the device: no host round trip
        tok_list, lp_list = tokens.tolist(), lps.tolist()
        tops = top_lists(top, rows)
        self.stats["generated_tokens"] += len(rows)
        for row, token, lp, tp in zip(rows, tok_list, lp_list, tops, strict=True):
            try:
                self.rules.accept(row, token, lp, tp, self.outbox.token, versions[row.adapter])
            except Exception as exc:  # noqa: BLE001 - this row's host work failed: it alone
                self._fail_rows([row], exc)
                continue
            if row.finish is not None:
                self._keep(row)
                self._free(row)
                self.outbox.resolve(row.req, self.rules.result(row))

    def _decode_failed(self, rows: list[Row], exc: Exception) -> None:
        if len(rows) == 1:
            self._fail_rows(rows, exc)
            return
        log.warning("a decode step of %d rows failed (%s: %s); running the unstreamed ones one at a time",
                    len(rows), type(exc).__name__, exc)
        self.stats["isolated_failures"] += 1
        rerun: list[_Queued] = []
        for row in rows:
            self._free(row)
            if row.req.emitted:  # tokens already streamed: a re-run would send others
                self.outbox.resolve(row.req, exc)
            elif row.req.waiting:
                rerun.append(_Queued(row.req, self.worker.clock.monotonic(), solo=True))
        with self.worker.cond:
            self._inbox.extendleft(reversed(rerun))

    # ------------------------------------------------------------------ slots
    def _keep(self, row: Row) -> None:
        """A finished row's keys and values into the prefix cache (its prompt and all it generated but the last
        token, which no decode step fed back). A failure to keep costs the reuse, never the row."""
        try:
            self.runner.keep(row.slot, row.req.prompt_ids, row.ids, row.adapter)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory for the copy
            log.warning("a finished row was not kept in the prefix cache (%s: %s)", type(exc).__name__, exc)

    def _free(self, row: Row) -> None:
        if row.slot >= 0 and self.slots[row.slot] is row:
            self.slots[row.slot] = None
            self.runner.release([row.slot])
        if not any(r is not None for r in self.slots):
            self._solo = False
            self.runner.restart()

    def _reset(self, row: Row) -> None:
        """Back to a freshly prepared state (same slot, same seed)."""
        row.generator = self.rules.prepare(row.req, row.policy_version).generator
        row.ids, row.logprobs, row.top, row.finish, row.cut_text = [], [], [], None, None
        row.versions = []

    def _fail_rows(self, rows: list[Row], exc: Exception) -> None:
        for row in rows:
            self._free(row)
            self.outbox.resolve(row.req, exc)


def _log_failure(exc: Exception) -> None:
    if isinstance(exc, GenerationError):
        log.error("generation request refused: %s", exc)
    else:
        log.error("generation failed: %s: %s", type(exc).__name__, exc)
