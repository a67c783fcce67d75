"""Admission within the staleness bound: the capacity rule, and begin refused with 429 at capacity, which the
client SDK waits out."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agentjet import SwarmClient
from agentjet.server.episodes.admission import capacity


@pytest.mark.parametrize(("kw", "want"), [
    ({"version": 0, "batch_episodes": 8, "max_staleness": 0, "accepted": 0, "running": 0}, 8),
    ({"version": 0, "batch_episodes": 8, "max_staleness": 0, "accepted": 3, "running": 5}, 0),
    ({"version": 2, "batch_episodes": 8, "max_staleness": 1, "accepted": 16, "running": 4}, 12),
    ({"version": 2, "batch_episodes": 8, "max_staleness": 1, "accepted": 16, "running": 4, "max_concurrent": 6}, 2),
])
def test_capacity_rule(kw: dict, want: int) -> None:
    assert capacity(**{"max_concurrent": None, **kw}) == want


@pytest.mark.parametrize("wait", [None, 0.0])
def test_begin_is_refused_at_capacity_and_the_client_waits(make_server, wait: float | None) -> None:
    """A client that asks not to wait gets 429 at once; the SDK waits either way: held on the server (default)
    or backing off and asking again (``admission_wait_s=0``)."""
    srv = make_server(training={"group_size": 2, "batch_groups": 1, "max_staleness": 0})
    url = f"{srv.url}/swarm/v1/episodes"
    first = [httpx.post(url, json={"client_id": "c", "task_id": "t"}) for _ in range(2)]
    assert all(r.status_code == 200 for r in first)
    refused = httpx.post(url, json={"client_id": "c", "task_id": "t", "wait_s": 0})  # asks not to wait
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
        async with SwarmClient(srv.url, admission_wait_s=wait) as client:
            async def one(task: str, reward: float) -> None:
                async with client.episode(task_id=task) as ep:
                    await ep.openai().chat.completions.create(model="tiny", messages=[{"role": "user",
                                                                                       "content": "hi"}])
                    ep.reward(reward)

            await asyncio.gather(one("a", 1.0), one("a", 0.0), one("b", 1.0), one("b", 0.0))
        return srv.server.counters.training.train_steps

    assert asyncio.run(two_more_groups()) >= 2
    status = srv.server.status()
    assert status.buffer.dropped_stale_episodes == 0  # nothing admitted beyond the bound, nothing dropped
    if wait is None:  # one group was held until the other trained; no 429 besides the one asked for above
        assert status.throughput["admission_held"] >= 1 and status.throughput["admission_refusals"] == 1
    else:
        assert status.throughput["admission_held"] == 0 and status.throughput["admission_refusals"] > 1


@pytest.mark.parametrize(("cap", "begun", "want"), [(1, 1, True), (1, 0, False), (2, 0, True), (0, 3, True),
                                                     (1, 2, False)])
def test_whole_groups_are_admitted(cap: int, begun: int, want: bool) -> None:
    from agentjet.server.episodes.admission import admits

    assert admits(capacity_now=cap, group_size=2, begun_in_group=begun) is want


# ---------------------------------------------------------------------- held begins (a long poll), fake clock
@pytest.fixture
def held_server(tmp_path, tiny_model_path):
    """An in-process server on a fake clock: group_size 2, one group per batch, max_staleness 0, so the
    capacity is 2 until a step trains."""
    from transformers import AutoTokenizer

    from agentjet.layouts.null import null_engine
    from agentjet.runtime.clock import FakeClock
    from agentjet.server import SwarmServer
    from agentjet.settings import ServerConfig, TrainingSettings

    def make(**training):
        cfg = ServerConfig(model=str(tiny_model_path), data_dir=tmp_path, admin_token="adm1n", training=TrainingSettings(
            **{"group_size": 2, "batch_groups": 1, "max_staleness": 0, "checkpoint_every": 0, **training}))
        return SwarmServer(cfg, null_engine(AutoTokenizer.from_pretrained(tiny_model_path)), clock=FakeClock())

    return make


def req(task: str, **kw):
    from agentjet.protocol import BeginEpisodeRequest

    return BeginEpisodeRequest(client_id=f"c-{task}-{kw.pop('n', 0)}", task_id=task, **kw)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_held_begins_are_admitted_as_a_group_when_it_fits(held_server) -> None:
    from agentjet.protocol import EpisodeStatus

    async def main() -> None:
        srv = held_server()
        await srv.start()
        try:
            a = [await srv.admission.begin(req("a", n=i)) for i in range(2)]  # the capacity (2) is taken
            b = [asyncio.create_task(srv.admission.begin(req("b", n=i))) for i in range(2)]
            c = asyncio.create_task(srv.admission.begin(req("c")))
            await settle()
            assert not any(t.done() for t in (*b, c))
            assert len(srv.admission.queue) == 3 and srv.admission.queue.groups() == 2
            # a member of a begun group does not wait: its place is held (group "a" lacks nobody here, so use
            # a fresh one-member group "d" after freeing one place below)
            await srv.episodes.abort(a[0].api_key, a[0].episode_id, "")
            await settle()
            assert srv.admission.capacity() == 1 and not any(t.done() for t in b)  # one place: not enough for b's two
            await srv.episodes.abort(a[1].api_key, a[1].episode_id, "")
            await settle()
            assert all(t.done() for t in b) and not c.done()  # b's two members went together; c is next
            assert {srv.registry.get(t.result().episode_id).status for t in b} == {EpisodeStatus.OPEN}
            assert dict(srv.registry.open_by_group) == {"b": 2} and len(srv.admission.queue) == 1
            assert srv.counters.admission.held == 3
            c.cancel()
        finally:
            await srv.stop(checkpoint=False)

    asyncio.run(main())


def test_a_held_begin_is_answered_429_when_its_wait_runs_out(held_server) -> None:
    from agentjet.server.errors import APIError

    async def main() -> None:
        srv = held_server(admission_wait_s=30)
        await srv.start()
        try:
            for i in range(2):
                await srv.admission.begin(req("a", n=i))
            short = asyncio.create_task(srv.admission.begin(req("s", wait_s=5)))
            long = asyncio.create_task(srv.admission.begin(req("l", wait_s=999)))  # capped at the server's 30 s
            await settle()
            srv.clock.advance(4.9)
            await srv.reap()
            await settle()
            assert not short.done() and not long.done()
            srv.clock.advance(0.2)
            await srv.reap()
            await settle()
            assert short.done() and not long.done()
            with pytest.raises(APIError) as err:
                short.result()
            assert err.value.status == 429 and err.value.code == "at_capacity"
            assert err.value.headers["Retry-After-Ms"] == "0"  # ask again at once: the next long poll
            srv.clock.advance(25)
            await srv.reap()
            await settle()
            with pytest.raises(APIError):
                long.result()
            assert len(srv.admission.queue) == 0 and srv.counters.admission.refusals == 2
            # a client that asks not to wait gets the 429 at once
            with pytest.raises(APIError) as now:
                await srv.admission.begin(req("n", wait_s=0))
            assert now.value.status == 429 and now.value.headers["Retry-After-Ms"] == "250"
        finally:
            await srv.stop(checkpoint=False)

    asyncio.run(main())


def test_a_begun_groups_member_skips_the_queue_and_new_groups_keep_their_order(held_server) -> None:
    async def main() -> None:
        srv = held_server(batch_groups=2)  # capacity 4
        await srv.start()
        try:
            a0 = await srv.admission.begin(req("a"))  # group a begun: 1 open, 1 place held
            b = [await srv.admission.begin(req("b", n=i)) for i in range(2)]
            assert srv.admission.capacity() == 1 and srv.admission.reserved() == 1
            c = asyncio.create_task(srv.admission.begin(req("c")))  # needs 2 places; 0 free besides a's held one
            d = asyncio.create_task(srv.admission.begin(req("d")))
            await settle()
            assert not c.done() and not d.done()
            a1 = await srv.admission.begin(req("a", n=1))  # not queued behind c and d: its place was held
            assert srv.registry.open_by_group["a"] == 2 and srv.admission.reserved() == 0
            for ep in (a0, a1, *b[:1]):
                await srv.episodes.abort(ep.api_key, ep.episode_id, "")
            await settle()
            assert c.done() and not d.done()  # c first: 3 places free, c takes 2, d needs 2
            d.cancel()
        finally:
            await srv.stop(checkpoint=False)

    asyncio.run(main())


def test_a_held_place_expires_after_the_group_timeout(held_server) -> None:
    async def main() -> None:
        srv = held_server(group_timeout_s=10)
        await srv.start()
        try:
            a = await srv.admission.begin(req("a"))  # its partner never comes (say its client was killed)
            assert srv.admission.reserved() == 1 and srv.admission.capacity() == 1
            b = asyncio.create_task(srv.admission.begin(req("b")))
            await settle()
            assert not b.done()
            srv.clock.advance(9.9)
            await srv.reap()
            assert srv.admission.reserved() == 1
            srv.clock.advance(0.2)
            await srv.reap()  # a's held place is released; its lone open episode still counts as running
            assert srv.admission.reserved() == 0 and srv.admission.capacity() == 1
            await srv.episodes.abort(a.api_key, a.episode_id, "")
            await settle()
            assert b.done() and b.exception() is None
        finally:
            await srv.stop(checkpoint=False)

    asyncio.run(main())


def test_a_client_gone_while_held_leaves_nothing(held_server) -> None:
    async def main() -> None:
        srv = held_server()
        await srv.start()
        try:
            a = [await srv.admission.begin(req("a", n=i)) for i in range(2)]
            gone = asyncio.Event()
            held = asyncio.create_task(srv.admission.begin(req("b"), client_gone=gone.wait))
            other = asyncio.create_task(srv.admission.begin(req("b", n=1)))
            await settle()
            gone.set()  # b's first member disconnects while held
            await settle()
            with pytest.raises(Exception) as err:
                held.result()
            assert getattr(err.value, "status", None) == 499
            assert len(srv.admission.queue) == 1 and srv.registry.open_by_group.get("b") is None
            # admitted in the very instant its client went away: the episode is aborted, its place freed
            gone2 = asyncio.Event()
            racer = asyncio.create_task(srv.admission.begin(req("c"), client_gone=gone2.wait))
            await settle()
            other.cancel()
            await settle()
            for ep in a:
                await srv.episodes.abort(ep.api_key, ep.episode_id, "")  # the pump admits c synchronously ...
            gone2.set()  # ... and its client is gone before the handler runs again
            await settle()
            assert racer.done() and racer.exception() is not None
            assert srv.registry.open_training == 0 and len(srv.admission.queue) == 0
            assert srv.admission.capacity() == 2 and srv.registry.counts["aborted"] == 3
        finally:
            await srv.stop(checkpoint=False)

    asyncio.run(main())


def test_a_server_shutting_down_answers_held_begins_at_once(held_server) -> None:
    from agentjet.server.errors import APIError

    async def main() -> None:
        srv = held_server()
        await srv.start()
        try:
            for i in range(2):
                await srv.admission.begin(req("a", n=i))
            held = asyncio.create_task(srv.admission.begin(req("b")))
            await settle()
            srv.exiting = lambda: True  # uvicorn is shutting down: it waits for the requests in flight
            await srv.reap()
            await settle()
            assert isinstance(held.exception(), APIError) and held.exception().status == 503
            assert len(srv.admission.queue) == 0
        finally:
            await srv.stop(checkpoint=False)

    asyncio.run(main())


def test_batches_take_groups_in_admission_order(tmp_path) -> None:
    from agentjet.runtime.clock import FakeClock
    from agentjet.server.counters import TrainingCounters
    from agentjet.server.store import SQLiteStore, StoredEpisode, StoredStatus
    from agentjet.server.training.pool import GroupPool
    from agentjet.settings import ServerConfig, TrainingSettings

    config = ServerConfig(training=TrainingSettings(group_size=2, batch_groups=1, max_staleness=2))
    pool = GroupPool(lambda: config.training, SQLiteStore(tmp_path / "s.sqlite"), TrainingCounters(), FakeClock())
    for key in ("first", "second", "third"):
        pool.note_admitted(key)
    for key in ("third", "second", "first"):  # completed in reverse
        for i in range(2):
            ep = StoredEpisode(episode_id=f"{key}-{i}", key_hash="h", client_id="c", task_id=key, task_type="default",
                               group_key=key, reward=float(i), status=StoredStatus.PENDING, n_calls=1, n_samples=0,
                               begin_policy_version=0, min_policy_version=0, ended_at=0.0)
            pool.store.commit_episode(ep, [], {})
            pool.add(ep)
    assert [g.key for g in pool.candidate_groups()] == ["first", "second", "third"]
    assert [g.key for g in pool.select_batch(pool.candidate_groups())] == ["first"]


# ---------------------------------------------------------------------- chaos: clients killed while held
def finish(url: str, ep: dict, reward: float) -> None:
    key = {"Authorization": f"Bearer {ep['api_key']}"}
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user",
                   "content": "hi"}]}, headers=key, timeout=30)
    assert r.status_code == 200, r.text
    assert httpx.post(f"{url}/swarm/v1/episodes/{ep['episode_id']}/end", json={"reward": reward}, headers=key,
                      timeout=30).is_success


def test_chaos_clients_killed_while_held_leave_no_episode_and_no_place(make_server) -> None:
    """Six begins held over HTTP (groups b, c, d); the clients of b's two members and of one of c's are killed
    (their requests cancelled, connections closed). Nothing is begun for them: b never begins, c begins with
    its surviving member and trains partial after the group timeout (its missing member's place is held no
    longer than that), d follows. At the end nothing is open, held or waiting, and the capacity is exactly
    the rule's."""
    from tests.conftest import wait_until

    srv = make_server(training={"group_size": 2, "batch_groups": 1, "max_staleness": 0, "min_group_size": 1,
                                "group_timeout_s": 1.0, "admission_wait_s": 60, "drop_uniform_groups": False})
    url = srv.url
    waiting = lambda: srv.server.status().throughput["admission_waiting"]  # noqa: E731
    a = [httpx.post(f"{url}/swarm/v1/episodes", json={"client_id": f"a{i}", "task_id": "a"}).json()
         for i in range(2)]

    async def main() -> None:
        async def held(name: str, task: str) -> dict:
            async with httpx.AsyncClient(base_url=url, timeout=90) as http:
                r = await http.post("/swarm/v1/episodes", json={"client_id": name, "task_id": task})
                assert r.status_code == 200, r.text
                return r.json()

        tasks = {n: asyncio.create_task(held(n, n[0])) for n in ("b1", "b2", "c1", "c2", "d1", "d2")}
        await asyncio.to_thread(wait_until, lambda: waiting() == 6, 20)
        for n in ("b1", "b2", "c1"):  # killed while held
            tasks[n].cancel()
        await asyncio.gather(*(tasks[n] for n in ("b1", "b2", "c1")), return_exceptions=True)
        await asyncio.to_thread(wait_until, lambda: waiting() == 3, 20)  # the server saw them go
        assert srv.server.registry.counts["begun"] == 2  # nothing begun for them
        for ep, reward in zip(a, (1.0, 0.0), strict=True):  # group a trains: the version moves, c then d fit
            await asyncio.to_thread(finish, url, ep, reward)

        async def play(name: str, reward: float) -> None:  # c and d are admitted in their order of arrival
            await asyncio.to_thread(finish, url, await tasks[name], reward)

        # c trains alone after its group timeout (min_group_size 1)
        await asyncio.gather(play("c2", 1.0), play("d1", 1.0), play("d2", 0.0))
        await asyncio.to_thread(wait_until, lambda: srv.server.counters.training.train_steps == 3, 20)

    asyncio.run(main())
    server = srv.server
    assert server.registry.counts == {"begun": 5, "expired": 0, "aborted": 0, "released": 0}
    assert {e.group_key for e in server.registry.episodes()} == {"a", "c", "d"}  # b never began
    assert server.registry.open_training == 0 and len(server.admission.queue) == 0 and server.admission.reserved() == 0
    assert server.counters.training.trained_episodes == 5 and server.pool.pending_count == 0
    t = server.config.training
    assert server.admission.capacity() == (t.max_staleness + server.engine.policy_version + 1) * t.group_size - 5 == 3
    assert server.counters.admission.held >= 6 and server.status().buffer.dropped_stale_episodes == 0
