"""The train loop: when to step. It wakes when an episode arrives (or every second), trains every batch its
lanes' pools have ready (``lanes.py``: one lane per policy; a server with several LoRA adapters has one per
adapter, each stepping when its own batch is ready), and goes idle; it pauses and resumes for the control plane,
holds ``step_lock`` around each step (control actions take it to run between steps), and pauses by itself when
the engine halts training."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from agentjet.engines.errors import TrainingHaltedError
from agentjet.runtime.clock import Clock
from agentjet.server.counters import TrainingCounters
from agentjet.server.store import SampleStore, StoredEpisode
from agentjet.server.training.checkpoints import Checkpoints, Pinned
from agentjet.server.training.lanes import Lane, lanes_of
from agentjet.server.training.pool import GroupPool
from agentjet.server.training.step import BatchStep

log = logging.getLogger(__name__)


class TrainLoop:
    def __init__(self, lanes: list[Lane], store: SampleStore, clock: Clock) -> None:
        if not lanes:
            raise ValueError("the train loop needs at least one lane")
        self.lanes = lanes
        self.store = store  # where an episode's adapters are read (``lanes_of``)
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
        self._started = clock.monotonic()
        self._idle_since: dict[str, float] = {}  # lane -> when its latest step ended (its wait for a batch)

    # the first lane's parts: the whole training core of a server with one policy
    @property
    def lane(self) -> Lane:
        return self.lanes[0]

    @property
    def pool(self) -> GroupPool:
        return self.lanes[0].pool

    @property
    def step(self) -> BatchStep:
        return self.lanes[0].step

    @property
    def checkpoints(self) -> Checkpoints:
        return self.lanes[0].checkpoints

    @property
    def counters(self) -> TrainingCounters:
        return self.lanes[0].counters

    def add_lane(self, lane: Lane) -> None:
        """A lane added at run time (an adapter added): it steps from the next pass."""
        self.lanes.append(lane)

    def remove_lane(self, name: str) -> Lane:
        """Stop stepping the adapter ``name`` (call between steps: under ``step_lock``)."""
        lane = next((x for x in self.lanes if x.name == name), None)
        if lane is None or len(self.lanes) == 1:
            raise ValueError(f"cannot remove lane {name!r}: " + ("not found" if lane is None else "the last one"))
        self.lanes.remove(lane)
        return lane

    # ------------------------------------------------------------ intake and control
    def add(self, ep: StoredEpisode) -> None:
        """An acknowledged training episode: into the pool of each lane that must consume it, and the loop
        wakes."""
        for lane in lanes_of(ep, self.lanes, self.store):
            lane.pool.add(ep)
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
        """Save a checkpoint of every lane between train steps (for the control plane); the first lane's path."""
        async with self.step_lock:
            paths = [await asyncio.to_thread(lane.checkpoints.save) for lane in list(self.lanes)]
        return paths[0]

    async def pin_best(self, eval_reward: float) -> Pinned:
        """``Checkpoints.pin_best`` for every lane between train steps (with adapters, the one eval pins each
        adapter's checkpoint of this moment); the first lane's answer."""
        async with self.step_lock:
            pins = [await asyncio.to_thread(lane.checkpoints.pin_best, eval_reward) for lane in list(self.lanes)]
        return pins[0]

    # ------------------------------------------------------------ stepping
    async def maybe_step(self, lane: Lane | None = None) -> dict[str, float] | None:
        """Train ``lane`` (default: the first) once if a full batch of its groups is ready."""
        lane = lane or self.lanes[0]
        if self.paused:
            return None
        batch = lane.pool.next_batch(lane.engine.policy_version)
        if batch is None:
            return None
        lane.step.waited_s = self.clock.monotonic() - self._idle_since.get(lane.label, self._started)
        try:
            async with self.step_lock:
                metrics = await lane.step.run(batch)
        except BaseException:
            lane.pool.give_back(batch)  # not consumed: back into the pool
            raise
        finally:
            lane.pool.settle()
            self._idle_since[lane.label] = self.clock.monotonic()
        if lane.engine.halted_reason is not None:  # the step counted; the engine cannot go on: pause now
            raise TrainingHaltedError(lane.engine.halted_reason)
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
        for lane in list(self.lanes):
            await self._drain(lane)
            if self.paused:
                return

    async def _drain(self, lane: Lane) -> None:
        """Train every batch ``lane`` has ready."""
        try:
            while not self._stopping and await self.maybe_step(lane):
                self._capacity_changed()
            self._capacity_changed()  # stale or uniform groups dropped: their places are free
        except TrainingHaltedError as exc:  # going on would train on wrong data: pause, say why, once
            if lane.counters.halt(str(exc)):
                log.error("training halted (paused): %s", exc)
            self.paused = True
        except Exception:  # a failed step must not kill the loop; the episodes stay pending
            log.exception("train step of %s failed; its episodes stay in the store", lane.label)
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
