"""Multi-model teams on two real servers: per-role samples on the right server, atomic commit and abort,
and recovery when the client dies between the two phases."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3

import httpx
import pytest
from tests.conftest import wait_until

from agentjet import Team
from agentjet.protocol import SWARM_PREFIX
from agentjet.runtime.clock import FakeClock

USER = [{"role": "user", "content": "plan it"}]


def counts(srv) -> dict[str, int]:
    return srv.server.reader.count_by_status()


def test_team_episode_trains_each_model_on_its_own_samples(make_server) -> None:
    a = make_server(reply="plan", training={"group_size": 2, "batch_groups": 1})
    b = make_server(reply="done", training={"group_size": 2, "batch_groups": 1})

    async def one(team: Team, rewards: dict) -> None:
        async with team.episode(task_id="t1") as ep:
            plan = await ep.openai("planner").chat.completions.create(model="x", messages=USER)
            assert plan.choices[0].message.content == "plan"
            act = await ep.openai("executor").chat.completions.create(model="x", messages=USER)
            assert act.choices[0].message.content == "done"
            ep.reward(rewards)
        assert ep.committed

    async def main() -> None:
        async with Team({"planner": a.url, "executor": b.url}) as team:
            await asyncio.gather(one(team, {"planner": 1.0, "executor": 0.0}),
                                 one(team, {"planner": 0.0, "executor": 1.0}))

    asyncio.run(main())
    wait_until(lambda: a.server.counters.training.train_steps == 1 and b.server.counters.training.train_steps == 1)
    # each server trained only its own role's samples
    assert all(len(batch) == 2 for batch in (a.server.engine.learner.trained[0], b.server.engine.learner.trained[0]))
    assert counts(a)["trained"] == 2 and counts(b)["trained"] == 2


def test_exception_aborts_the_team_everywhere(make_server) -> None:
    a, b = make_server(), make_server()

    async def main() -> None:
        async with Team({"planner": a.url, "executor": b.url}) as team:
            with pytest.raises(RuntimeError, match="tool down"):
                async with team.episode(task_id="t") as ep:
                    await ep.openai("planner").chat.completions.create(model="x", messages=USER)
                    raise RuntimeError("tool down")

    asyncio.run(main())
    for srv in (a, b):
        assert srv.server.registry.counts["aborted"] == 1 and counts(srv)["pending"] == 0


def test_a_failed_prepare_aborts_the_prepared_members(make_server) -> None:
    a, b = make_server(), make_server()

    async def main() -> None:
        async with Team({"planner": a.url, "executor": b.url}) as team:
            with pytest.raises(ValueError, match="none of the roles served by"):
                async with team.episode(task_id="t") as ep:
                    await ep.openai("planner").chat.completions.create(model="x", messages=USER)
                    await ep.openai("executor").chat.completions.create(model="x", messages=USER)
                    ep.reward({"planner": 1.0})  # the executor made calls but gets no reward

    asyncio.run(main())
    assert counts(a)["prepared"] == 0 and counts(a)["aborted"] == 1 and counts(a)["pending"] == 0
    assert counts(b)["pending"] == 0


def _prepare_only(team: Team, commit_coordinator: bool):
    async def main() -> None:
        async with team:
            ep = team.episode(task_id="t")
            await ep.__aenter__()
            await ep.openai("planner").chat.completions.create(model="x", messages=USER)
            await ep.openai("executor").chat.completions.create(model="x", messages=USER)
            ep.reward(1.0)
            await ep.prepare()
            if commit_coordinator:
                await ep._commit(team.servers[0])
            # ... and the client "crashes" here: nothing more is sent

    return main()


@pytest.mark.parametrize("coordinator_committed", [False, True])
def test_crash_between_phases_leaves_no_half_committed_team(make_server, coordinator_committed: bool) -> None:
    """On fake clocks: the crash is seen when the leases run out, not while the client is still working (a slow,
    loaded machine let real 0.8 s leases expire between its calls)."""
    ca, cb = FakeClock(), FakeClock()
    a, b = make_server(lease_seconds=0.8, clock=ca), make_server(lease_seconds=0.8, clock=cb)
    asyncio.run(_prepare_only(Team({"planner": a.url, "executor": b.url}), coordinator_committed))

    def settled() -> bool:
        # Each poll moves both clocks past a lease. The participant (b) asks the coordinator (a) once its lease
        # is out; if it asks before a's own sweep has decided, it is told "undecided" and asks again a lease
        # later, which on a fake clock comes only when the clock is moved again (the test below).
        ca.advance(1.0)
        cb.advance(1.0)
        return counts(a)["prepared"] == 0 and counts(b)["prepared"] == 0

    wait_until(settled, timeout=20)
    expected = "pending" if coordinator_committed else "aborted"
    assert counts(a)[expected] == 1 and counts(b)[expected] == 1  # all or nothing


def test_a_participant_that_asks_before_the_coordinator_decides_asks_again(make_server) -> None:
    """The participant's sweep asks while the coordinator is undecided: it must ask again later and then follow
    the decision. (It once raised there, which ended that server's lease sweep for good.)"""
    ca, cb = FakeClock(), FakeClock()
    a, b = make_server(lease_seconds=0.8, clock=ca), make_server(lease_seconds=0.8, clock=cb)
    asyncio.run(_prepare_only(Team({"planner": a.url, "executor": b.url}), False))  # a coordinates
    cb.advance(1.0)  # only the participant's lease is out: it asks a, which has not decided yet

    def asked_and_waits() -> bool:
        deadlines = list(b.server.teams.prepared.values())
        return bool(deadlines) and min(deadlines) > cb.monotonic()

    wait_until(asked_and_waits, timeout=20)
    assert counts(b)["prepared"] == 1 and counts(a)["prepared"] == 1
    ca.advance(1.0)  # now the coordinator's lease is out: it aborts and records the decision
    wait_until(lambda: counts(a)["aborted"] == 1, timeout=20)
    cb.advance(1.0)  # the participant asks again and follows
    wait_until(lambda: counts(b)["prepared"] == 0, timeout=20)
    assert counts(b)["aborted"] == 1 and counts(b)["pending"] == 0


def test_team_decision_needs_the_team_secret(make_server) -> None:
    a, b = make_server(lease_seconds=30), make_server(lease_seconds=30)
    team = Team({"planner": a.url, "executor": b.url})
    asyncio.run(_prepare_only(team, commit_coordinator=True))
    team_id = a.server.store.prepared_episodes() or None
    assert team_id is None  # the coordinator committed
    with contextlib.closing(sqlite3.connect(a.server.store.path)) as db:  # the decision the coordinator recorded
        row = db.execute("SELECT team_id FROM teams").fetchone()
    r = httpx.get(f"{a.url}{SWARM_PREFIX}/teams/{row[0]}", headers={"Authorization": "Bearer wrong"})
    assert r.json()["decision"] == "undecided"  # no leak without the secret


def test_store_recovery_keeps_prepared_team_episodes(make_server) -> None:
    """Regression: recovering from an unwritable store must not forget prepared team episodes."""
    a, b = make_server(lease_seconds=30), make_server(lease_seconds=30)
    asyncio.run(_prepare_only(Team({"planner": a.url, "executor": b.url}), commit_coordinator=False))
    assert len(b.server.teams.prepared) == 1
    b.server.store_health.failed()  # as after a failed write; the next begin probes the store and recovers
    r = httpx.post(f"{b.url}/swarm/v1/episodes", json={"client_id": "c", "task_id": "t"})
    assert r.status_code == 200 and b.server.store_health.healthy
    assert len(b.server.teams.prepared) == 1
