"""Client SDK against real servers: the learning loop on the tiny model, SDKs, streaming, staleness, resume."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from tests.conftest import settle, wait_until

from agentjet import SwarmClient, SwarmError, SyncSwarmClient
from agentjet.client.runner import Cursor, run_workflow

USER = [{"role": "user", "content": "what is 2 + 2?"}]


async def one_episode(client: SwarmClient, task_id: str, reward: float, **chat) -> str:
    async with client.episode(task_id=task_id) as ep:
        reply = await ep.openai().chat.completions.create(model="tiny", messages=USER, max_tokens=8, **chat)
        assert reply.choices[0].message.role == "assistant"
        ep.reward(reward)
    assert ep.result is not None and ep.result.acknowledged
    return ep.episode_id


def test_full_loop_bumps_policy_version_on_tiny_model(make_server) -> None:
    srv = make_server("tiny", training={"group_size": 2, "batch_groups": 1})
    before = [p.detach().clone() for p in srv.server.engine.generator.model.parameters()]

    async def main() -> list[str]:
        async with SwarmClient(srv.url) as client:
            return await asyncio.gather(*[one_episode(client, "t1", r) for r in (1.0, 0.0)])

    ids = asyncio.run(main())
    wait_until(lambda: srv.server.status().train_steps == 1)  # committed: the store and counters have it
    assert srv.server.engine.policy_version == 1
    status = httpx.get(f"{srv.url}/swarm/v1/status").json()
    assert status["train_steps"] == 1 and status["buffer"]["trained_episodes"] == 2
    assert status["last_train_metrics"]["mean_abs_logprob_diff"] < 1e-3  # exact behaviour logprobs
    consumed = srv.server.store.consumed_steps()
    assert {i: consumed[i] for i in ids} == {i: [1] for i in ids}
    after = list(srv.server.engine.generator.model.parameters())
    assert any(not (a == b).all() for a, b in zip(before, after, strict=True))


def test_exception_in_block_aborts_and_reraises(make_server) -> None:
    srv = make_server()

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            with pytest.raises(RuntimeError, match="tool crashed"):
                async with client.episode(task_id="t") as ep:
                    await ep.openai().chat.completions.create(model="tiny", messages=USER)
                    raise RuntimeError("tool crashed")
            with pytest.raises(ValueError, match="without a reward"):
                async with client.episode(task_id="t"):
                    pass

    asyncio.run(main())
    assert srv.server.registry.counts["aborted"] == 2
    assert srv.server.reader.count_by_status()["pending"] == 0


def test_client_retries_until_the_server_is_up(make_server, tmp_path: Path) -> None:
    from agentjet.runtime.launch import free_port

    port = free_port()

    async def main() -> None:
        async with SwarmClient(f"http://127.0.0.1:{port}", retries=2, join=False) as client:
            with pytest.raises(SwarmError, match="cannot reach"):
                await client.join()

    asyncio.run(main())


def test_sync_client_and_langchain(make_server) -> None:
    from langchain_openai import ChatOpenAI

    srv = make_server(reply="four")
    with SyncSwarmClient(srv.url) as client:
        with client.episode(task_id="t1") as ep:
            text = ep.openai().chat.completions.create(model="tiny", messages=USER).choices[0].message.content
            llm = ChatOpenAI(base_url=ep.base_url, api_key=ep.api_key, model="planner", max_retries=0)
            lc = llm.invoke("what is 2 + 2?")
            ep.reward({"default": 1.0 if text == "four" else 0.0, "planner": 1.0 if lc.content == "four" else 0.0})
        assert client.status().buffer.pending_episodes == 1
    stored = srv.server.store.pending_episodes()[0]
    assert stored.reward == {"default": 1.0, "planner": 1.0}
    assert stored.n_calls == 2


def test_streaming_matches_non_streaming(make_server) -> None:
    srv = make_server("tiny")

    async def main() -> tuple[str, str, list[str]]:
        async with SwarmClient(srv.url) as client, client.episode(task_id="t") as ep:
            oa = ep.openai()
            plain = await oa.chat.completions.create(model="tiny", messages=USER, max_tokens=20, seed=3)
            stream = await oa.chat.completions.create(model="tiny", messages=USER, max_tokens=20, seed=3,
                                                      stream=True, stream_options={"include_usage": True})
            pieces, usage = [], None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
                usage = chunk.usage or usage
            assert usage is not None and usage.completion_tokens == plain.usage.completion_tokens
            ep.reward(0.0)
            return plain.choices[0].message.content, "".join(pieces), pieces

    plain, streamed, pieces = asyncio.run(main())
    assert streamed == plain
    assert len(pieces) > 1  # really incremental


def test_streaming_with_logprobs_sends_them_in_the_last_chunk(make_server) -> None:
    srv = make_server("tiny")

    async def main() -> tuple[int, list[float]]:
        async with SwarmClient(srv.url) as client, client.episode(task_id="t") as ep:
            stream = await ep.openai().chat.completions.create(model="tiny", messages=USER, max_tokens=8, seed=3,
                                                               logprobs=True, stream=True,
                                                               stream_options={"include_usage": True})
            logprobs: list[float] = []
            tokens = 0
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].logprobs is not None:
                    logprobs += [c.logprob for c in chunk.choices[0].logprobs.content or []]
                tokens = chunk.usage.completion_tokens if chunk.usage else tokens
            ep.reward(0.0)
            return tokens, logprobs

    tokens, logprobs = asyncio.run(main())
    assert tokens > 0 and len(logprobs) == tokens and all(lp <= 0.0 for lp in logprobs)


def request_tasks(srv) -> set[asyncio.Task]:
    """The server loop's live tasks, less the trainer's idle wait (``wait_for`` wraps it in a fresh task)."""
    async def live() -> set[asyncio.Task]:
        return {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()
                and getattr(t.get_coro(), "__qualname__", "") != "Event.wait"}

    return srv.call(live())


def test_a_client_leaving_mid_stream_leaves_no_pending_task(make_server, caplog) -> None:
    import gc
    import logging

    import httpx

    srv = make_server("tiny")
    before = request_tasks(srv)
    ep = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "c", "task_id": "t"}).json()
    body = {"model": "tiny", "messages": USER, "max_tokens": 400, "stream": True, "stop": ["never-appears"]}
    caplog.set_level(logging.ERROR, logger="asyncio")
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {ep['api_key']}"}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data:")  # the role chunk: the stream is live
    episode = srv.server.registry.get(ep["episode_id"])
    wait_until(lambda: episode.inflight == 0, timeout=60)
    wait_until(lambda: not (request_tasks(srv) - before), timeout=60)  # every task of the request has ended
    gc.collect()
    assert "Task was destroyed" not in caplog.text
    assert httpx.get(f"{srv.url}/health").json()["status"] == "ready"


def test_staleness_bound_drops_and_counts(make_server) -> None:
    # admission off: the test makes stale episodes on purpose, which admission would not let begin
    srv = make_server(training={"group_size": 2, "batch_groups": 1, "max_staleness": 0, "admission": False})

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            old = [await client.episode(task_id="old").begin() for _ in range(2)]
            for ep in old:  # generated at policy v0
                await ep.openai().chat.completions.create(model="tiny", messages=USER)
            await asyncio.gather(*[one_episode(client, "fresh", r) for r in (1.0, 0.0)])
            await asyncio.to_thread(wait_until, lambda: srv.server.engine.policy_version == 1)
            for ep, r in zip(old, (1.0, 0.0), strict=True):
                await ep.end(r)

    asyncio.run(main())
    wait_until(lambda: srv.server.status().buffer.dropped_stale_episodes == 2)
    assert srv.server.engine.policy_version == 1  # the stale group was not trained


def test_within_staleness_bound_is_trained_with_behaviour_logprobs(make_server) -> None:
    srv = make_server("tiny", training={"group_size": 2, "batch_groups": 1, "max_staleness": 1})

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            old = [await client.episode(task_id="old").begin() for _ in range(2)]
            for ep in old:
                await ep.openai().chat.completions.create(model="tiny", messages=USER, max_tokens=8)
            await asyncio.gather(*[one_episode(client, "fresh", r) for r in (1.0, 0.0)])
            await asyncio.to_thread(wait_until, lambda: srv.server.engine.policy_version == 1)
            for ep, r in zip(old, (1.0, 0.0), strict=True):
                await ep.end(r)

    asyncio.run(main())
    wait_until(lambda: srv.server.counters.training.train_steps == 2)  # (the version moves before the metrics land)
    metrics = srv.server.counters.training.last_metrics
    assert metrics["mean_abs_logprob_diff"] > 1e-6  # off-policy by one version: a real importance ratio
    assert srv.server.status().buffer.dropped_stale_episodes == 0


def test_runner_groups_failures_and_cursor(make_server, tmp_path: Path) -> None:
    srv = make_server(training={"group_size": 2, "batch_groups": 1})
    tasks = [{"task_id": f"t{i}", "n": i} for i in range(4)]

    async def workflow(task, ep) -> float:
        if task["n"] == 3:
            raise RuntimeError("environment failed")
        reply = await ep.openai().chat.completions.create(model="tiny", messages=USER)
        return float(len(reply.choices[0].message.content) % 2)

    cursor = Cursor(tmp_path / "cursor.json")

    async def main():
        async with SwarmClient(srv.url) as client:
            return await run_workflow(client, workflow, tasks, group_size=2, concurrency=3, cursor=cursor)

    summary = asyncio.run(main())
    assert summary.episodes == 8 and summary.failed == 2
    assert summary.failures_by_task == {"t3": 2}
    assert Cursor(tmp_path / "cursor.json").done == {0, 1, 2, 3}
    again = asyncio.run(main())  # resumes: nothing left to do
    assert again.episodes == 0


def test_resume_from_checkpoint(make_server, tmp_path: Path) -> None:
    data = tmp_path / "resumable"
    srv = make_server("tiny", data_dir=data, training={"group_size": 2, "batch_groups": 1, "checkpoint_every": 1})

    async def phase1() -> None:
        async with SwarmClient(srv.url) as client:
            await asyncio.gather(*[one_episode(client, "a", r) for r in (1.0, 0.0)])
            await asyncio.to_thread(wait_until, lambda: srv.server.status().train_steps == 1)  # committed
            await one_episode(client, "b", 1.0)  # half a group: stays pending in the store

    asyncio.run(phase1())
    weights = {k: v.clone() for k, v in srv.server.engine.generator.model.state_dict().items()}
    srv.stop()
    assert (data / "checkpoints" / "latest").exists()

    srv2 = make_server("tiny", data_dir=data, resume=True, training={"group_size": 2, "batch_groups": 1})
    assert srv2.server.engine.policy_version == 1
    for k, v in srv2.server.engine.generator.model.state_dict().items():
        assert (v == weights[k]).all()
    assert srv2.server.status().buffer.pending_episodes == 1
    resumed = srv2.server.status()  # the checkpoint's version is committed and served again, not 0
    assert (resumed.policy_version, resumed.learner_version, resumed.weight_push_in_flight) == (1, 1, False)

    async def phase2() -> None:
        async with SwarmClient(srv2.url) as client:
            await one_episode(client, "b", 0.0)

    asyncio.run(phase2())
    # the engine's version moves inside the step, before the store marks its episodes: wait for the commit
    wait_until(lambda: srv2.server.status().train_steps == 2)
    assert srv2.server.engine.policy_version == 2
    consumed = srv2.server.store.consumed_steps()
    assert len(consumed) == 4 and all(len(s) == 1 for s in consumed.values())


def test_store_rewind_returns_episodes_trained_after_the_checkpoint(tmp_path: Path) -> None:
    from agentjet.server.store import SQLiteStore, StoredEpisode, StoredStatus

    store = SQLiteStore(tmp_path / "s.sqlite")
    for i in range(3):
        store.commit_episode(StoredEpisode(f"e{i}", "h", "c", "t", "d", "t", 1.0, StoredStatus.PENDING, 0, 0, 0, 0,
                                           time.time()), [], {})
    store.mark_consumed({"e0": StoredStatus.TRAINED}, step=1)
    store.mark_consumed({"e1": StoredStatus.TRAINED}, step=2)
    assert [e.episode_id for e in store.pending_episodes()] == ["e2"]
    assert store.rewind_to_step(1) == 1
    assert [e.episode_id for e in store.pending_episodes()] == ["e1", "e2"]
    # idempotent commit
    assert store.commit_episode(StoredEpisode("e0", "h", "c", "t", "d", "t", 1.0, StoredStatus.PENDING, 0, 0, 0, 0,
                                              time.time()), [], {}) is False


def test_incomplete_group_is_used_after_the_timeout(make_server) -> None:
    srv = make_server(training={"group_size": 4, "min_group_size": 2, "group_timeout_s": 0.5, "batch_groups": 1})

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            await asyncio.gather(*[one_episode(client, "t", r) for r in (1.0, 0.0)])  # half a group

    asyncio.run(main())
    wait_until(lambda: srv.server.counters.training.train_steps == 1, timeout=15)
    assert len(srv.server.engine.learner.trained[0]) == 2


def test_n_choices_and_stop_through_the_api(make_server) -> None:
    srv = make_server("tiny")

    async def main() -> None:
        async with SwarmClient(srv.url) as client, client.episode(task_id="t") as ep:
            oa = ep.openai()
            many = await oa.chat.completions.create(model="tiny", messages=USER, n=3, max_tokens=12, seed=5)
            assert [c.index for c in many.choices] == [0, 1, 2]
            calls = srv.server.registry.get(ep.episode_id).calls
            assert len(calls) == 3
            assert many.usage.completion_tokens == sum(len(c.completion_ids) for c in calls)
            text = many.choices[0].message.content
            assert len(text) > 4
            stop = text[2:4]
            cut = await oa.chat.completions.create(model="tiny", messages=USER, max_tokens=12, seed=5, stop=[stop])
            assert cut.choices[0].message.content == text[: text.find(stop)]
            assert cut.choices[0].finish_reason == "stop"
            ep.reward(0.0)

    asyncio.run(main())


def test_runner_runs_repeated_task_ids_every_time(make_server) -> None:
    """Regression: a dataset may list a task id twice (e.g. an eval set cycled); each line is its own work."""
    srv = make_server()
    tasks = [{"task_id": "same"}, {"task_id": "other"}, {"task_id": "same"}, {"task_id": "same"}]

    async def workflow(task, ep) -> float:
        await ep.openai().chat.completions.create(model="tiny", messages=USER)
        return 1.0

    async def main():
        async with SwarmClient(srv.url) as client:
            return await run_workflow(client, workflow, tasks, group_size=1, concurrency=1)

    summary = asyncio.run(main())
    assert summary.episodes == 4 and srv.server.counters.requests.episodes_ended == 4


def test_client_backoff_honours_retry_after_and_gives_up(monkeypatch) -> None:
    """A 503 with Retry-After is retried no sooner than asked; after `retries` attempts the error surfaces."""
    from agentjet.client import client as client_mod

    calls: list[float] = []
    sleeps: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(time.monotonic())
        return httpx.Response(503, headers={"Retry-After": "3"},
                              json={"error": {"message": "busy", "type": "service_unavailable", "code": "x"}})

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    monkeypatch.setattr(client_mod.asyncio, "sleep", fake_sleep)

    async def main() -> SwarmError:
        c = SwarmClient("http://swarm.test", join=False, retries=2)
        c._http = httpx.AsyncClient(base_url="http://swarm.test", transport=httpx.MockTransport(handler))
        try:
            await c.status()
        except SwarmError as exc:
            return exc
        finally:
            await c.close()
        raise AssertionError("no error")

    exc = asyncio.run(main())
    assert exc.status == 503 and len(calls) == 3
    assert len(sleeps) == 2 and all(s >= 3.0 for s in sleeps)


def test_runner_uses_the_servers_group_size_and_warns_on_a_mismatch(make_server, caplog) -> None:
    import logging

    srv = make_server(training={"group_size": 3, "batch_groups": 1})
    seen: list[str] = []
    ended = iter(range(100))

    async def workflow(task: dict, ep) -> float:  # noqa: ANN001
        seen.append(task["task_id"])
        await ep.openai().chat.completions.create(model="tiny", messages=USER)
        return float(next(ended) % 2)  # mixed rewards: the group is trained, not skipped

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            assert client.joined is not None and client.joined.group_size == 3
            assert client.joined.sampling["max_tokens"] == srv.server.config.sampling.max_tokens
            with caplog.at_level(logging.WARNING, logger="agentjet.client.client"):
                await run_workflow(client, workflow, [{"task_id": "a"}], concurrency=4)
                assert "differs" not in caplog.text
                await run_workflow(client, workflow, [{"task_id": "b"}], group_size=2, concurrency=4)
                assert "group_size 2 differs from the server's group_size 3" in caplog.text
                caplog.clear()
                await run_workflow(client, workflow, [{"task_id": "e"}], group_size=1, eval=True)
                assert "differs" not in caplog.text  # eval episodes form no training groups

    asyncio.run(main())
    assert seen.count("a") == 3 and seen.count("b") == 2 and seen.count("e") == 1
    wait_until(lambda: srv.server.counters.training.train_steps == 1)  # the full group of 3 trained


def test_a_failed_checkpoint_does_not_hand_trained_episodes_back(make_server) -> None:
    """The step is committed in the store before the checkpoint; a checkpoint that fails (disk full, a trainer
    group that lost a rank while saving) must not put its episodes back into the pool to be trained twice."""
    srv = make_server("null", training={"group_size": 2, "batch_groups": 1, "checkpoint_every": 1})
    engine = srv.server.engine

    def broken_save(path: Path) -> None:
        raise OSError("no space left on device")

    engine.save = broken_save

    async def main() -> list[str]:
        async with SwarmClient(srv.url) as client:
            return await asyncio.gather(*[one_episode(client, "t", r) for r in (1.0, 0.0)])

    ids = asyncio.run(main())
    wait_until(lambda: engine.policy_version == 1)
    settle(srv)  # the train loop has passed over the pool again after the failure: nothing trained again
    assert engine.policy_version == 1 and len(engine.learner.trained) == 1
    consumed = srv.server.store.consumed_steps()
    assert {i: consumed[i] for i in ids} == {i: [1] for i in ids}
    assert srv.server.pool.pending_count == 0
