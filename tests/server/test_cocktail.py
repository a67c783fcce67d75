"""Cocktail training: per-task-type quotas on every batch, deferral of over-represented types, strict/fill."""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from tests.conftest import settle, wait_until

from agentjet import SwarmClient
from agentjet.runtime.clock import FakeClock
from agentjet.server.training.quotas import apportion

USER = [{"role": "user", "content": "go"}]


def test_apportion_sums_and_rounds_fairly() -> None:
    assert apportion(10, {"math": 0.7, "code": 0.3}) == {"math": 7, "code": 3}
    assert apportion(10, {"math": 0.4, "code": 0.3, "terminal": 0.3}) == {"math": 4, "code": 3, "terminal": 3}
    assert sum(apportion(2, {"a": 1, "b": 1, "c": 1}).values()) == 2
    assert apportion(5, {"a": 0, "b": 1}) == {"a": 0, "b": 5}


async def groups_of(client: SwarmClient, task_type: str, n_groups: int, counter: itertools.count) -> None:
    async def one(task_id: str, r: float) -> None:
        async with client.episode(task_id=task_id, task_type=task_type) as ep:
            await ep.openai().chat.completions.create(model="x", messages=USER)
            ep.reward(r)

    for _ in range(n_groups):
        tid = f"{task_type}-{next(counter)}"
        await asyncio.gather(one(tid, 1.0), one(tid, 0.0))


def step_shares(srv) -> list[dict[str, float]]:
    return [{k: v for k, v in m.items() if k.startswith("share/")} for _, _, m, _ in srv.server.store.step_metrics()]


def test_batches_follow_the_ratios_and_wait_for_a_missing_type(make_server) -> None:
    srv = make_server(training={"group_size": 2, "batch_groups": 2, "task_ratios": {"math": 0.5, "code": 0.5},
                                "absent_policy": "strict"})
    counter = itertools.count()

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            await groups_of(client, "math", 2, counter)
            await asyncio.to_thread(settle, srv)
            assert srv.server.counters.training.train_steps == 0  # two math groups, no code: wait
            await groups_of(client, "code", 1, counter)
            await asyncio.to_thread(wait_until, lambda: srv.server.counters.training.train_steps == 1)

    asyncio.run(main())
    assert step_shares(srv) == [{"share/code": 0.5, "share/math": 0.5}]
    assert srv.server.pool.pending_count == 2  # the second math group waits for the next batch
    status = httpx.get(f"{srv.url}/swarm/v1/status").json()
    assert status["task_types"]["math"]["episodes"] == 2 and status["task_types"]["code"]["episodes"] == 2


def test_over_represented_type_is_deferred_with_retry_after(make_server) -> None:
    srv = make_server(training={"group_size": 2, "batch_groups": 2, "task_ratios": {"math": 0.5, "code": 0.5}})
    begin = lambda t, wait=0.0: httpx.post(f"{srv.url}/swarm/v1/episodes",  # noqa: E731
                                           json={"client_id": "c", "task_id": f"{t}-1", "task_type": t,
                                                 "wait_s": wait})
    assert begin("code").status_code == 200  # code is present: math keeps to its own share
    for _ in range(4):  # two batches' worth of math's share (1 group x 2 episodes x 2)
        assert begin("math").status_code == 200
    r = begin("math")
    assert r.status_code == 429 and r.json()["error"]["code"] == "deferred"
    assert "retry after 500 ms" in r.json()["error"]["message"] and r.headers["retry-after-ms"] == "500"
    assert begin("code").status_code == 200
    bad = begin("poetry")
    assert bad.status_code == 400 and "no ratio" in bad.json()["error"]["message"]
    assert begin("poetry", wait=5).status_code == 400  # a held begin is checked first too
    # held (a long poll): math waits for its share; code is not blocked behind it; math's wait ends deferred
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(begin, "math", 1.0)
        wait_until(lambda: srv.server.status().throughput["admission_waiting"] == 1, timeout=10)
        fresh = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "c", "task_id": "code-2",
                                                                 "task_type": "code", "wait_s": 5})
        assert fresh.status_code == 200  # a new code group, queued behind the held math group, goes first
        assert srv.server.status().throughput["admission_waiting"] == 1
        r = held.result(timeout=10)
    assert r.status_code == 429 and r.json()["error"]["code"] == "deferred"
    assert r.headers["retry-after-ms"] == "0"  # a long poll: ask again at once


@pytest.mark.parametrize(("policy", "trains"), [("fill", True), ("strict", False)])
def test_absent_type_policy(make_server, policy: str, trains: bool) -> None:
    """A type that was seen begin counts as present for ``absent_after_s`` (on the server's fake clock); after
    that, ``fill`` trains without it and ``strict`` keeps waiting."""
    clock = FakeClock()
    srv = make_server(clock=clock, training={"group_size": 2, "batch_groups": 2, "absent_policy": policy,
                                             "task_ratios": {"math": 0.5, "code": 0.5}, "absent_after_s": 30})
    counter = itertools.count()

    code = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "coder", "task_id": "c-0",
                                                            "task_type": "code"})
    assert code.status_code == 200  # a code episode is running: code is present

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            await groups_of(client, "math", 2, counter)

    asyncio.run(main())
    settle(srv)
    assert srv.server.counters.training.train_steps == 0  # both policies wait for a type that is present
    clock.advance(31)
    settle(srv)
    assert srv.server.counters.training.train_steps == (1 if trains else 0)
    if trains:
        assert step_shares(srv) == [{"share/math": 1.0}]


def test_a_type_left_alone_fills_the_batches_of_the_absent_types_instead_of_waiting_on_itself(make_server) -> None:
    """The deadlock a three-dataset cocktail hit (issue 36): math had two groups pending, its cap (two batches'
    worth of its one-group share) deferred its next begin, and a batch of three groups could never fill while
    code and poetry sent nothing (their groups all dropped as uniform, their clients stuck on math's
    deferrals). Once the others are absent, their shares count as math's: it begins again and trains."""
    clock = FakeClock()
    srv = make_server(clock=clock, training={"group_size": 2, "batch_groups": 3, "absent_after_s": 30,
                                             "task_ratios": {"math": 1 / 3, "code": 1 / 3, "poetry": 1 / 3}})
    for t in ("code", "poetry"):  # they began once (present), then stopped
        r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "c", "task_id": f"{t}-0", "task_type": t})
        httpx.post(f"{srv.url}/swarm/v1/episodes/{r.json()['episode_id']}/abort", json={},
                   headers={"Authorization": f"Bearer {r.json()['api_key']}"})
    counter = itertools.count()
    begin = lambda: httpx.post(f"{srv.url}/swarm/v1/episodes",  # noqa: E731
                               json={"client_id": "c", "task_id": "math-x", "task_type": "math", "wait_s": 0})

    async def math_groups(n: int) -> None:
        async with SwarmClient(srv.url) as client:
            await groups_of(client, "math", n, counter)

    asyncio.run(math_groups(2))
    settle(srv)
    r = begin()
    assert r.status_code == 429 and r.json()["error"]["code"] == "deferred"  # the others are still present
    clock.advance(31)  # code and poetry are absent now
    r = begin()
    assert r.status_code == 200  # their shares count as math's
    httpx.post(f"{srv.url}/swarm/v1/episodes/{r.json()['episode_id']}/abort", json={},
               headers={"Authorization": f"Bearer {r.json()['api_key']}"})
    asyncio.run(math_groups(1))
    settle(srv)
    assert srv.server.counters.training.train_steps == 1 and step_shares(srv) == [{"share/math": 1.0}]


def test_two_producers_at_70_30(make_server) -> None:
    srv = make_server(training={"group_size": 2, "batch_groups": 10, "task_ratios": {"math": 0.7, "code": 0.3},
                                "absent_policy": "strict"})
    counter = itertools.count()

    async def producer(task_type: str, n_groups: int) -> None:
        async with SwarmClient(srv.url, client_id=f"{task_type}-client") as client:
            await groups_of(client, task_type, n_groups, counter)

    async def main() -> None:  # code produces as fast as math: quotas, not arrival order, set the mix
        await asyncio.gather(producer("math", 21), producer("code", 12))

    asyncio.run(main())
    wait_until(lambda: srv.server.counters.training.train_steps == 3, timeout=30)
    shares = step_shares(srv)
    for s in shares:  # each batch of 20 episodes: 14 math, 6 code (exactly, hence within +-1)
        assert round(s["share/math"] * 20) == 14 and round(s["share/code"] * 20) == 6


ADMIN = {"Authorization": "Bearer adm1n"}


def test_ratio_change_takes_effect_from_the_next_batch(make_server) -> None:
    srv = make_server(admin_token="adm1n", training={"group_size": 2, "batch_groups": 2,
                                                     "task_ratios": {"math": 0.5, "code": 0.5},
                                                     "absent_policy": "strict"})
    counter = itertools.count()

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            await groups_of(client, "math", 1, counter)
            await groups_of(client, "code", 1, counter)
            await asyncio.to_thread(wait_until, lambda: srv.server.counters.training.train_steps == 1)
            change = {"training": {"task_ratios": {"math": 1.0, "code": 0.0}}}
            refused = httpx.post(f"{srv.url}/swarm/v1/control/config", headers=ADMIN, json=change)
            assert refused.status_code == 409, refused.text  # code clients ran just now: they would be shut out
            err = refused.json()["error"]
            assert err["code"] == "task_types_shut_out" and "['code']" in err["message"] and "force" in err["message"]
            assert srv.server.config.training.task_ratios == {"math": 0.5, "code": 0.5}  # nothing applied
            r = httpx.post(f"{srv.url}/swarm/v1/control/config", headers=ADMIN, json={**change, "force": True})
            assert r.status_code == 200 and r.json()["policy_version"] == 1
            await groups_of(client, "math", 2, counter)
            await asyncio.to_thread(wait_until, lambda: srv.server.counters.training.train_steps == 2)

    asyncio.run(main())
    assert step_shares(srv) == [{"share/code": 0.5, "share/math": 0.5}, {"share/math": 1.0}]
    bad = httpx.post(f"{srv.url}/swarm/v1/control/config", headers=ADMIN,
                     json={"training": {"task_ratios": {"math": -1}}})
    assert bad.status_code == 400 and "task_ratios" in bad.json()["error"]["message"]
