"""Admission within the staleness bound: the capacity rule, and begin refused with 429 at capacity, which the
client SDK waits out."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agentjet import SwarmClient
from agentjet.server.admission import capacity


@pytest.mark.parametrize(("kw", "want"), [
    ({"version": 0, "batch_episodes": 8, "max_staleness": 0, "accepted": 0, "running": 0}, 8),
    ({"version": 0, "batch_episodes": 8, "max_staleness": 0, "accepted": 3, "running": 5}, 0),
    ({"version": 2, "batch_episodes": 8, "max_staleness": 1, "accepted": 16, "running": 4}, 12),
    ({"version": 2, "batch_episodes": 8, "max_staleness": 1, "accepted": 16, "running": 4, "max_concurrent": 6}, 2),
])
def test_capacity_rule(kw: dict, want: int) -> None:
    assert capacity(**{"max_concurrent": None, **kw}) == want


def test_begin_is_refused_at_capacity_and_the_client_waits(make_server) -> None:
    srv = make_server(training={"group_size": 2, "batch_groups": 1, "max_staleness": 0})
    url = f"{srv.url}/swarm/v1/episodes"
    first = [httpx.post(url, json={"client_id": "c", "task_id": "t"}) for _ in range(2)]
    assert all(r.status_code == 200 for r in first)
    refused = httpx.post(url, json={"client_id": "c", "task_id": "t"})
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "at_capacity"
    assert refused.headers["retry-after"] == "1" and "max_staleness=0" in refused.json()["error"]["message"]
    assert httpx.post(url, json={"client_id": "c", "task_id": "t", "eval": True}).status_code == 200  # not limited
    assert srv.server.status().throughput["admission_refusals"] == 1

    for r, reward in zip(first, (1.0, 0.0), strict=True):  # end the first group: it trains, the version moves on
        ep = r.json()
        key = {"Authorization": f"Bearer {ep['api_key']}"}
        httpx.post(f"{srv.url}/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user",
                   "content": "hi"}]}, headers=key)
        assert httpx.post(f"{url}/{ep['episode_id']}/end", json={"reward": reward}, headers=key).is_success

    async def two_more_groups() -> int:  # 4 episodes at once: the SDK waits at capacity instead of failing
        async with SwarmClient(srv.url) as client:
            async def one(task: str, reward: float) -> None:
                async with client.episode(task_id=task) as ep:
                    await ep.openai().chat.completions.create(model="tiny", messages=[{"role": "user",
                                                                                       "content": "hi"}])
                    ep.reward(reward)

            await asyncio.gather(one("a", 1.0), one("a", 0.0), one("b", 1.0), one("b", 0.0))
        return srv.server.trainer.counters.train_steps

    assert asyncio.run(two_more_groups()) >= 2
    status = srv.server.status()
    assert status.buffer.dropped_stale_episodes == 0  # nothing admitted beyond the bound, nothing dropped


@pytest.mark.parametrize(("cap", "begun", "want"), [(1, 1, True), (1, 0, False), (2, 0, True), (0, 3, True),
                                                     (1, 2, False)])
def test_whole_groups_are_admitted(cap: int, begun: int, want: bool) -> None:
    from agentjet.server.admission import admits

    assert admits(capacity_now=cap, group_size=2, begun_in_group=begun) is want
