"""The runner: drive a workflow ``async def fn(task, ep) -> float | dict`` over a dataset.

Each task runs as a group of ``group_size`` episodes (same task id, for GRPO). A workflow exception
aborts that episode, is counted, and the run goes on. A cursor file records finished tasks so a
restarted runner resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentjet.client.client import Episode, SwarmClient
from agentjet.files import write_atomic
from agentjet.protocol import Reward, reward_mean

if TYPE_CHECKING:  # a type only: the runner loads no task module (the task sources are the caller's)
    from agentjet.tasks.source import TaskSource

log = logging.getLogger(__name__)

Workflow = Callable[[dict[str, Any], Episode], Awaitable[Reward]]


@dataclass
class RunSummary:
    episodes: int = 0
    failed: int = 0
    not_begun: int = 0  # episodes whose begin was still waiting (admission, a quota deferral) when the run stopped
    rewards: list[float] = field(default_factory=list)
    failures_by_task: Counter[str] = field(default_factory=Counter)
    failure_kinds: Counter[str] = field(default_factory=Counter)
    last_policy_version: int = 0
    seconds: float = 0.0
    calls: int = 0  # chat calls of the acknowledged episodes
    samples: int = 0  # training samples the server built from them (fewer when timeline merging merged calls)

    def merge(self, other: RunSummary) -> None:
        self.episodes += other.episodes
        self.failed += other.failed
        self.not_begun += other.not_begun
        self.rewards += other.rewards
        self.failures_by_task.update(other.failures_by_task)
        self.failure_kinds.update(other.failure_kinds)
        self.last_policy_version = max(self.last_policy_version, other.last_policy_version)
        self.seconds += other.seconds
        self.calls += other.calls
        self.samples += other.samples

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else float("nan")

    @property
    def merge_ratio(self) -> float:
        """Chat calls per training sample (1.0: every call its own sample; higher: calls merged)."""
        return self.calls / self.samples if self.samples else float("nan")


@dataclass
class ReplyTrace:
    """One single-call episode as ``task_workflow`` saw it: the reply and its reward (the trace of a task without
    a multi-turn ``rollout``)."""

    reward: float = 0.0
    transcript: list[str] = field(default_factory=list)  # the one reply


def task_workflow(task_mod: TaskSource, sampling: dict[str, Any], *, model: str = "agent",
                  traces: list[tuple[dict[str, Any], Any]] | None = None) -> Workflow:
    """The workflow of a task module (``agentjet.tasks``' interface): the task's own multi-turn
    ``rollout(task, ep, sampling)`` if it has one, else one chat call scored by ``reward(task, text)``. A task
    with an ``index`` gets ``sampling``'s seed plus its index. With ``traces``, each episode's (task, trace) is
    appended there: the task's own ``EpisodeTrace`` for a multi-turn task that traces its episodes, a
    ``ReplyTrace`` (the reply and its reward) for a single-call task."""
    rollout = getattr(task_mod, "rollout", None)
    trace_cls = getattr(task_mod, "EpisodeTrace", None) if traces is not None else None

    async def workflow(task: dict[str, Any], ep: Episode) -> float:
        params = dict(sampling)
        if "seed" in params and "index" in task:
            params["seed"] = int(params["seed"]) + int(task["index"])
        if rollout is not None and trace_cls is not None and traces is not None:
            trace = trace_cls()
            reward = float(await rollout(task, ep, params, trace=trace))
            traces.append((task, trace))
        elif rollout is not None:
            reward = float(await rollout(task, ep, params))
        else:
            reply = await ep.openai().chat.completions.create(model=model, messages=task["messages"], **params)
            text = reply.choices[0].message.content or ""
            reward = float(task_mod.reward(task, text))
            if traces is not None and rollout is None:
                traces.append((task, ReplyTrace(reward=reward, transcript=[text])))
        return reward

    return workflow


def load_workflow(spec: str) -> Workflow:
    """``path/to/file.py:fn`` or ``package.module:fn`` -> the function."""
    target, sep, name = spec.rpartition(":")
    if not sep or not name:
        raise ValueError(f"workflow {spec!r} must look like path/to/file.py:function or module:function")
    if target.endswith(".py") or os.sep in target:
        path = Path(target)
        if not path.exists():
            raise ValueError(f"workflow file {path} does not exist")
        mod_name = f"agentjet_workflow_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        assert module_spec and module_spec.loader
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    fn = getattr(module, name, None)
    if fn is None or not inspect.iscoroutinefunction(fn):
        raise ValueError(f"{spec!r} must name an `async def {name}(task, ep)` function")
    return fn


def load_dataset(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    tasks = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                task = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from exc
            if not isinstance(task, dict):
                raise ValueError(f"{path}:{lineno}: each line must be a JSON object")
            task.setdefault("task_id", f"{path.stem}-{lineno}")
            tasks.append(task)
            if limit and len(tasks) >= limit:
                break
    return tasks


class Cursor:
    """Finished tasks, by their position in the dataset (ids may repeat), persisted atomically."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.done: set[int] = set()
        if path is not None and path.exists():
            self.done = {int(i) for i in json.loads(path.read_text()).get("done", [])}

    def mark(self, position: int) -> None:
        self.done.add(position)
        if self.path is not None:
            write_atomic(self.path, json.dumps({"done": sorted(self.done)}))


async def begin_unless_stopped(ep: Episode, stop: asyncio.Event | None) -> bool:
    """Begin ``ep``, unless ``stop`` is set first: a begin still waiting on the server (its admission long poll, or
    a cocktail quota's deferral, which the client waits out for up to ``defer_timeout``) is given up, so a run's
    budget ends it at once. False: not begun. A begin the server answered as the stop came is kept (True)."""
    if stop is None:
        await ep.begin()
        return True
    if stop.is_set():
        return False
    begin, halt = asyncio.ensure_future(ep.begin()), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({begin, halt}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        halt.cancel()
    if not begin.done():
        begin.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await begin
    if begin.cancelled():
        return False
    begin.result()  # a refused begin raises here
    return True


async def run_episode(client: SwarmClient, workflow: Workflow, task: dict[str, Any], summary: RunSummary,
                      eval: bool = False, stop: asyncio.Event | None = None) -> float | None:
    """One episode of ``task``; its reward, or None when it failed (counted) or ``stop`` came before it began."""
    ep = client.episode(task_id=str(task["task_id"]), task_type=str(task.get("task_type", "default")), eval=eval)
    try:
        if not await begin_unless_stopped(ep, stop):
            summary.not_begun += 1
            return None
        async with ep:
            reward = await workflow(task, ep)
            if reward is None:
                raise ValueError("the workflow returned no reward")
            ep.reward(reward)
            summary.last_policy_version = max(summary.last_policy_version, ep.policy_version)
        if ep.result is not None:
            summary.calls += ep.result.calls
            summary.samples += ep.result.samples
        value = reward_mean(reward)
        summary.rewards.append(value)
        summary.episodes += 1
        return value
    except Exception as exc:
        summary.episodes += 1
        summary.failed += 1
        summary.failures_by_task[str(task["task_id"])] += 1
        summary.failure_kinds[type(exc).__name__] += 1
        log.warning("episode of task %s failed: %r", task.get("task_id"), exc)
        return None


async def run_workflow(
    client: SwarmClient,
    workflow: Workflow,
    tasks: Iterable[dict[str, Any]],
    *,
    group_size: int | None = None,
    concurrency: int = 8,
    eval: bool = False,
    cursor: Cursor | None = None,
    on_progress: Callable[[RunSummary], None] | None = None,
    stop: asyncio.Event | None = None,
) -> RunSummary:
    """Run ``group_size`` episodes per task (default: the server's group size, from ``join``), at most
    ``concurrency`` at a time, in dataset order. Once ``stop`` is set no new episode begins (the queued ones
    are dropped, the running ones finish)."""
    # Eval episodes are never trained, so their group size need not match the server's.
    group_size = group_size if eval and group_size is not None else client.group_size(group_size)
    if group_size < 1 or concurrency < 1:
        raise ValueError("group_size and concurrency must be >= 1")
    cursor = cursor or Cursor(None)
    summary = RunSummary()
    start = time.monotonic()
    queue: asyncio.Queue[tuple[dict[str, Any], int] | None] = asyncio.Queue(maxsize=concurrency)
    remaining: dict[int, int] = {}  # dataset position -> episodes of its group still running

    async def worker() -> None:
        while (item := await queue.get()) is not None:
            task, position = item
            if stop is not None and stop.is_set():
                continue
            await run_episode(client, workflow, task, summary, eval=eval, stop=stop)
            remaining[position] -= 1
            if remaining[position] == 0:
                del remaining[position]
                cursor.mark(position)
            if on_progress:
                on_progress(summary)

    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    for position, task in enumerate(tasks):
        if stop is not None and stop.is_set():
            break  # an endless task source ends here; what is already queued is skipped by the workers
        if position in cursor.done:
            continue
        remaining[position] = group_size
        for _ in range(group_size):
            await queue.put((task, position))
    for _ in workers:
        await queue.put(None)
    await asyncio.gather(*workers)
    summary.seconds = time.monotonic() - start
    return summary
