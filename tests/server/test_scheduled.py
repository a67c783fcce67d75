"""The scheduled training client against a real server (null engine that always answers '7')."""

from __future__ import annotations

import asyncio
import itertools

from agentjet import SwarmClient
from agentjet.client.runner import run_workflow
from agentjet.client.scheduled import run_scheduled
from agentjet.client.settings import RunSettings
from agentjet.schedule import Curriculum, CurriculumSettings, StoppingRule, StopSettings, TaskState
from agentjet.tasks import addition


async def _answer(task, ep) -> float:  # noqa: ANN001
    reply = await ep.openai().chat.completions.create(model="m", messages=task["messages"], max_tokens=4)
    return addition.reward(task, reply.choices[0].message.content or "")


def test_curriculum_periodic_evals_and_pauses(make_server) -> None:
    srv = make_server(reply="7", admin_token="adm1n", training={"group_size": 2, "batch_groups": 1})
    pool = [addition.make_task(a, b) for a, b in [(3, 4), (5, 2), (1, 1), (2, 2)]]
    evals = [addition.make_task(0, 7, "eval"), addition.make_task(1, 2, "eval")]
    cur = Curriculum([t["task_id"] for t in pool], CurriculumSettings(solved_after=1, hard_after=1, revisit=0.0))
    paused: list[float] = []

    async def at_pause(clock: float) -> None:
        paused.append(clock)
        assert srv.server.train_loop.paused  # training is paused while the eval runs

    async def main():
        async with SwarmClient(srv.url, token="adm1n") as client:  # pausing training needs the admin token
            return await run_scheduled(client, _answer, _answer, pool, evals,
                                       RunSettings(group_size=2, concurrency=4, time_budget_s=3.0,
                                                   eval_every_s=1.0, poll_s=0.1),
                                       curriculum=cur, at_pause=at_pause)

    run = asyncio.run(main())
    assert run.stop_reason == "time_budget"
    assert len(run.evals) >= 4 and all(e.reward == 0.5 and e.episodes == 2 for e in run.evals)  # 0+7 right, 1+2 not
    assert run.evals[0].train_seconds == 0.0 and paused and all(p <= 3.5 for p in paused)
    assert [e.train_seconds >= 3.0 for e in run.evals].count(True) == 1  # no periodic eval right before the final
    assert cur.state(pool[0]["task_id"]) is TaskState.SOLVED and cur.state(pool[2]["task_id"]) is TaskState.HARD
    assert run.groups > 4 and run.uniform_groups == run.groups  # a fixed reply: every group uniform
    assert run.train.calls == run.train.samples > 0 and run.merge_ratio == 1.0
    assert not srv.server.train_loop.paused  # resumed after the last eval
    assert srv.server.reader.count_by_status()["eval"] == 2 * len(run.evals)


def test_stopping_rule_ends_a_run_with_no_signal(make_server) -> None:
    srv = make_server(reply="7", admin_token="adm1n", training={"group_size": 2, "batch_groups": 1})
    pool = [addition.make_task(1, 1), addition.make_task(2, 2)]

    async def main():
        async with SwarmClient(srv.url) as client:
            return await run_scheduled(client, _answer, _answer, pool, [],
                                       RunSettings(group_size=2, concurrency=4, time_budget_s=60,
                                                   eval_every_s=None, poll_s=0.1),
                                       stopping=StoppingRule(StopSettings(window=6, uniform_share=0.9)))

    run = asyncio.run(main())
    assert run.stop_reason == "no_signal" and run.train_seconds < 30 and not run.evals


def test_no_episode_begins_after_stop(make_server) -> None:
    """A stopped run drains nothing: the queued episodes are dropped, only the running ones finish."""
    srv = make_server(reply="7", training={"group_size": 1, "min_group_size": 1, "batch_groups": 1})
    stop = asyncio.Event()
    tasks = [addition.make_task(a, 1) for a in range(10)]

    async def workflow(task, ep) -> float:  # noqa: ANN001
        reward = await _answer(task, ep)
        if task["a"] == 2:
            stop.set()
        return reward

    async def main():
        async with SwarmClient(srv.url) as client:
            # an endless task source: stop must end the producer too, not only the workers
            return await run_workflow(client, workflow, itertools.cycle(tasks), group_size=1, concurrency=1,
                                      stop=stop)

    summary = asyncio.run(main())
    assert summary.episodes == 3 and summary.failed == 0
    assert srv.server.counters.requests.episodes_ended == 3
