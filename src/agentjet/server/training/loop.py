"""The train loop: when to step. It wakes when an episode arrives (or every second), trains every batch the
pool has ready, and goes idle; it pauses and resumes for the control plane, holds ``step_lock`` around each
step (control actions take it to run between steps), and pauses by itself when the engine halts training."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from agentjet.engines.errors import TrainingHaltedError
from agentjet.runtime.clock import Clock
from agentjet.server.counters import TrainingCounters
from agentjet.server.store import StoredEpisode
from agentjet.server.training.checkpoints import Checkpoints
from agentjet.server.training.pool import GroupPool
from agentjet.server.training.step import BatchStep

log = logging.getLogger(__name__)


class Halting(Protocol):
    """What the loop reads of the engine: the version batches are checked against for staleness, and after
    each step whether training can go on (None) or why not."""

    @property
    def halted_reason(self) -> str | None: ...

    @property
    def policy_version(self) -> int: ...


class TrainLoop:
    def __init__(self, pool: GroupPool, step: BatchStep, checkpoints: Checkpoints, engine: Halting,
                 counters: TrainingCounters, clock: Clock) -> None:
        self.pool = pool
        self.step = step
        self.checkpoints = checkpoints
        self.engine = engine
        self.counters = counters
        self.clock = clock
        self.paused = False
        self.step_lock = asyncio.Lock()  # held by a train step; control actions take it to run between steps
        self.on_capacity: Callable[[], None] | None = None  # called after each batching pass (admission wakes)
        self._wake = asyncio.Event()
        self._passes = 0  # passes finished (each trains every ready batch, then idles)
        self._in_pass = False
        self._pass_done = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._idle_since = clock.monotonic()

    # ------------------------------------------------------------ intake and control
    def add(self, ep: StoredEpisode) -> None:
        """An acknowledged training episode: into the pool, and the loop wakes."""
        self.pool.add(ep)
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    async def pause(self, wait_for_step: bool = False) -> None:
        """Start no new train step. ``wait_for_step``: also wait for a step in progress to finish (it holds
        ``step_lock``; a step that has not taken the lock yet sees ``paused`` first and does not start)."""
        self.paused = True
        if wait_for_step:
            async with self.step_lock:
                pass

    def resume(self) -> None:
        self.paused = False
        self._wake.set()

    async def checkpoint_now(self) -> Path:
        """Save a checkpoint between train steps (for the control plane)."""
        async with self.step_lock:
            return await asyncio.to_thread(self.checkpoints.save)

    # ------------------------------------------------------------ stepping
    async def maybe_step(self) -> dict[str, float] | None:
        """Train once if a full batch of groups is ready."""
        if self.paused:
            return None
        batch = self.pool.next_batch(self.engine.policy_version)
        if batch is None:
            return None
        self.step.waited_s = self.clock.monotonic() - self._idle_since
        try:
            async with self.step_lock:
                metrics = await self.step.run(batch)
        except BaseException:
            self.pool.give_back(batch)  # not consumed: back into the pool
            raise
        finally:
            self.pool.settle()
            self._idle_since = self.clock.monotonic()
        if self.engine.halted_reason is not None:  # the step counted; the engine cannot go on: pause now
            raise TrainingHaltedError(self.engine.halted_reason)
        return metrics

    async def run(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)
            self._wake.clear()
            self._in_pass = True
            try:
                await self._one_pass()
            finally:
                self._in_pass = False
                self._passes += 1
                async with self._pass_done:
                    self._pass_done.notify_all()

    async def _one_pass(self) -> None:
        try:
            while not self._stopping and await self.maybe_step():
                self._capacity_changed()
            self._capacity_changed()  # stale or uniform groups dropped: their places are free
        except TrainingHaltedError as exc:  # going on would train on wrong data: pause, say why, once
            if self.counters.halt(str(exc)):
                log.error("training halted (paused): %s", exc)
            self.paused = True
        except Exception:  # a failed step must not kill the loop; the episodes stay pending
            log.exception("train step failed; its episodes stay in the store")
            await asyncio.sleep(1.0)

    async def settled(self) -> None:
        """Return once the loop has made a whole pass over the pool that began after this call: it has trained
        every batch that was ready then, or passed them by (paused, halted, a failed step), and gone idle. So
        "nothing trained" is shown by an event, not by waiting a while."""
        target = self._passes + (2 if self._in_pass else 1)
        self._wake.set()
        async with self._pass_done:
            await self._pass_done.wait_for(lambda: self._passes >= target or self._task is None or self._task.done())

    def _capacity_changed(self) -> None:
        if self.on_capacity is not None:
            self.on_capacity()

    # ------------------------------------------------------------ life
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the train loop runs on (started): tests and embedders submit coroutines to it."""
        if self._task is None:
            raise RuntimeError("the train loop has not started")
        return self._task.get_loop()
