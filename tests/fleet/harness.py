"""The demo task against a real ``ajet server`` with a fleet of generator replicas, with one replica lost in the
middle (SIGKILLed, or its Ray node removed): shared by the two-machine tests (``test_join.py``, ``test_ray.py``)
and the benchmarks (``benchmarks/reliability/replica_kill.py``, ``benchmarks/serving/replicas.py``).

The client runs demo-task episodes (addition: begin, one chat call, the task's reward with a length term, end),
``concurrency`` at a time. The chat call is plain HTTP without retries, so every answer's status is counted: a 5xx would show. An
episode is lost when it was begun and not acknowledged, or acknowledged and then neither trained, pending nor
dropped by the server (``lost_episodes``).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentjet.protocol import ServerStatus
from agentjet.runtime.launch import ServerProcess, start_ready
from agentjet.settings import ServerConfig
from agentjet.tasks import addition


@dataclass
class Call:
    start: float
    end: float
    status: int
    tokens: int


@dataclass
class DemoLoad:
    """What the client saw."""

    calls: list[Call] = field(default_factory=list)
    begun: int = 0
    acknowledged: int = 0
    failed: list[str] = field(default_factory=list)  # episodes that were not acknowledged, and why
    rewards: list[float] = field(default_factory=list)

    @property
    def statuses(self) -> Counter[int]:
        return Counter(c.status for c in self.calls)

    @property
    def server_errors(self) -> int:
        return sum(n for s, n in self.statuses.items() if s >= 500)

    def in_flight_at(self, t: float) -> list[Call]:
        return [c for c in self.calls if c.start <= t < c.end]


def demo_reward(task: dict[str, Any], text: str) -> float:
    """The demo task's reward, plus a small term for the reply's length: the random tiny model never answers right,
    and a group whose rewards are all equal teaches nothing (it is dropped, untrained), so without it nothing would
    train and no weight push would reach the replicas."""
    return addition.reward(task, text) + 0.1 * (len(text) % 5) / 4


async def episode(http: httpx.AsyncClient, task: dict[str, Any], load: DemoLoad, max_tokens: int) -> None:
    r = await http.post("/swarm/v1/episodes", json={"client_id": "fleet-demo", "task_id": task["task_id"],
                                                    "task_type": task["task_type"]})
    if r.status_code != 200:
        load.failed.append(f"begin: {r.status_code} {r.text[:200]}")
        return
    ep = r.json()
    load.begun += 1
    headers = {"Authorization": f"Bearer {ep['api_key']}"}
    body = {"model": "agent", "messages": task["messages"], **addition.SAMPLING, "max_tokens": max_tokens}
    t0 = time.monotonic()
    r = await http.post("/v1/chat/completions", headers=headers, json=body)
    reply = r.json() if r.status_code == 200 else None
    load.calls.append(Call(t0, time.monotonic(), r.status_code, reply["usage"]["completion_tokens"] if reply else 0))
    if reply is None:
        load.failed.append(f"chat: {r.status_code} {r.text[:200]}")
        await http.post(f"/swarm/v1/episodes/{ep['episode_id']}/abort", headers=headers, json={"reason": "failed"})
        return
    reward = demo_reward(task, reply["choices"][0]["message"]["content"] or "")
    r = await http.post(f"/swarm/v1/episodes/{ep['episode_id']}/end", headers=headers, json={"reward": reward})
    if r.status_code != 200:
        load.failed.append(f"end: {r.status_code} {r.text[:200]}")
        return
    load.acknowledged += 1
    load.rewards.append(reward)


async def demo_load(url: str, episodes: int, concurrency: int, max_tokens: int = 10, seed: int = 0,
                    group_size: int = 4) -> DemoLoad:
    """``episodes`` demo episodes (GRPO groups of ``group_size`` per task), ``concurrency`` in flight."""
    tasks = [t for t in addition.generate_tasks("train", episodes // group_size + 1, seed) for _ in range(group_size)]
    load = DemoLoad()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for task in tasks[:episodes]:
        queue.put_nowait(task)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0),
                                 limits=httpx.Limits(max_connections=concurrency + 8)) as http:
        async def worker() -> None:
            while not queue.empty():
                await episode(http, queue.get_nowait(), load, max_tokens)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return load


async def when_busy(url: str, replica: str, after_episodes: int, load: asyncio.Future[DemoLoad]) -> None:
    """Return once ``after_episodes`` episodes have ended and ``replica`` is generating (a call in flight)."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        while True:
            s = ServerStatus.model_validate((await http.get("/swarm/v1/status")).json())
            mine = next(r for r in (s.fleet.replicas if s.fleet else []) if r.name == replica)
            if s.throughput["episodes_ended"] >= after_episodes and mine.in_flight > 0:
                return
            assert not load.done(), f"the run ended before replica {replica} could be caught generating"
            await asyncio.sleep(0.01)


def status(url: str) -> ServerStatus:
    return ServerStatus.model_validate(httpx.get(f"{url}/swarm/v1/status", timeout=30).json())


def lost_episodes(load: DemoLoad, s: ServerStatus) -> int:
    """Begun and not acknowledged, plus acknowledged and not accounted for by the server (trained, pending or
    dropped)."""
    b = s.buffer
    accounted = b.trained_episodes + b.pending_episodes + b.dropped_stale_episodes + b.dropped_uniform_episodes
    return (load.begun - load.acknowledged) + max(load.acknowledged - accounted, 0)


def replica_pid(s: ServerStatus, name: str) -> int:
    """The pid of a replica process on this machine, from its ``where``."""
    where = next(r.where for r in (s.fleet.replicas if s.fleet else []) if r.name == name)
    found = re.search(r"process (\d+)", where)
    assert found, where
    return int(found.group(1))


def wait_status(url: str, check, timeout: float, what: str, interval: float = 0.1) -> tuple[ServerStatus, float]:
    """Poll the status until ``check(status)``; (that status, when it was seen)."""
    deadline = time.monotonic() + timeout
    while True:
        s = status(url)
        if check(s):
            return s, time.monotonic()
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {s.fleet}"
        time.sleep(interval)


def replica_state(s: ServerStatus, name: str) -> str:
    return next(r.state for r in (s.fleet.replicas if s.fleet else []) if r.name == name)


def start_server(config: ServerConfig, workdir: Path, timeout: float = 600.0,
                 env: dict[str, str] | None = None) -> ServerProcess:
    """``ajet server`` with ``config`` (its port picked free), ready."""
    return start_ready(lambda port: ServerProcess("fleet", config.model_copy(update={"port": port}),
                                                  workdir / "server.log", workdir / "server.yaml", env=env),
                       timeout=timeout)
