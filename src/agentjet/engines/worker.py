"""The embedded engine's one torch thread. All of the engine's torch work runs here, so generation and
training never overlap and share one copy of the weights.

The thread runs *jobs* (a train step, a static batch, a checkpoint load: any callable) one at a time and, when
no job is waiting, lets a *stepper* (the continuous scheduler) do one unit of work: admit requests, one decode
step. A job submitted while requests are generating therefore runs between two decode steps. Everything that
escapes a unit of work is caught: the stepper fails what it holds (``fail_all``) and the thread goes on, so no
caller ever waits on a dead thread.

A job may change the weights (a train step, a weight copy, an adapter added): ``changes`` counts the jobs run, so
that what was computed from the weights (the kept prefixes of ``generators/hf/prefix_cache.py``) can tell it is
stale. A job that only reads (a health ping, a score) runs through ``read`` and is not counted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, TypeVar

from agentjet.engines.errors import EngineUnavailableError
from agentjet.runtime.clock import Clock, SystemClock

log = logging.getLogger(__name__)
T = TypeVar("T")


class _Job(NamedTuple):
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: concurrent.futures.Future[Any]
    reads_only: bool


def settle(fut: asyncio.Future[Any], outcome: Any) -> None:
    """Set a caller's future to ``outcome`` (an exception fails it), on the future's own loop; nothing if it is
    done (its caller went away)."""
    if fut.done():
        return
    if isinstance(outcome, BaseException):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)


def run_callbacks(calls: list[Callable[[], None]]) -> None:
    """What one wake-up of a caller's event loop runs (stream tokens, then results), in order; a callback's own
    failure is logged and the others go on."""
    for call in calls:
        try:
            call()
        except Exception:
            log.exception("a token callback failed")


class Stepper(Protocol):
    def pending(self, now: float) -> float | None:
        """Called under the worker's lock: 0 to step now, seconds to wait before stepping, None when idle."""

    def step(self) -> None:
        """One unit of work (on the worker thread, without the lock)."""

    def fail_all(self, exc: Exception) -> None:
        """Fail every request held (queued or generating): the worker could not go on with them."""


class EngineWorker:
    def __init__(self, name: str = "agentjet-engine", clock: Clock | None = None) -> None:
        self.name = name
        self.clock = clock or SystemClock()
        self.cond = threading.Condition()  # guards the job queue and the stepper's inbox
        self._jobs: deque[_Job] = deque()
        self.changes = 0  # jobs run that may have changed the weights (every job but a ``read``)
        self._stepper: Stepper | None = None
        self._thread: threading.Thread | None = None
        self._closing = False

    def attach(self, stepper: Stepper) -> None:
        self._stepper = stepper

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def ensure_started(self) -> None:
        with self.cond:
            if self._closing:
                raise EngineUnavailableError("the engine is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()

    def notify(self) -> None:
        with self.cond:
            self.cond.notify()

    # ------------------------------------------------------------------ jobs
    def submit(self, fn: Callable[..., T], *args: Any, reads_only: bool = False) -> concurrent.futures.Future[T]:
        """Run ``fn(*args)`` on the worker thread (between decode steps); a future of its result.
        ``reads_only``: it changes no weights (not counted in ``changes``)."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.ensure_started()
        with self.cond:
            self._jobs.append(_Job(fn, args, fut, reads_only))
            self.cond.notify()
        return fut

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self.submit(fn, *args))

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """``run`` for a job that changes no weights (a ping, a score): what was computed from them stays valid."""
        return await asyncio.wrap_future(self.submit(fn, *args, reads_only=True))

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the worker thread, waited for by the caller (runs inline on the worker itself)."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        return self.submit(fn, *args).result()

    # ------------------------------------------------------------------ the loop
    def _next(self) -> _Job | None:
        """Wait for a job (returned) or for the stepper to have work (None). Raises SystemExit when closing."""
        with self.cond:
            while True:
                if self._closing:
                    raise SystemExit
                if self._jobs:
                    return self._jobs.popleft()
                wait = self._stepper.pending(self.clock.monotonic()) if self._stepper is not None else None
                if wait is not None and wait <= 0:
                    return None
                self.cond.wait(wait)

    def _loop(self) -> None:
        while True:
            try:
                job = self._next()
            except SystemExit:
                return
            if job is not None:
                fut = job.future
                if fut.set_running_or_notify_cancel():
                    if not job.reads_only:
                        self.changes += 1
                    try:
                        fut.set_result(job.fn(*job.args))
                    except BaseException as exc:  # noqa: BLE001 - handed to the caller
                        fut.set_exception(exc)
                continue
            assert self._stepper is not None
            try:
                self._stepper.step()
            except Exception as exc:  # noqa: BLE001 - never let the thread die with callers waiting
                log.exception("the generation loop failed; failing the requests it held")
                self._stepper.fail_all(EngineUnavailableError(f"the generation loop failed: {type(exc).__name__}: {exc}"))

    def close(self, timeout: float = 30.0) -> None:
        """Stop the thread after the job or step under way; fail queued jobs and held requests."""
        with self.cond:
            self._closing = True
            jobs, self._jobs = list(self._jobs), deque()
            self.cond.notify_all()
        for job in jobs:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(EngineUnavailableError("the engine was closed"))
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._stepper is not None:
            self._stepper.fail_all(EngineUnavailableError("the engine was closed"))
