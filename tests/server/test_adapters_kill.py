"""Several LoRA adapters on the real embedded engine (the tiny random model), through the server: a step of one
adapter changes its own outputs and leaves the other's alone, and a SIGKILLed server resumes every adapter at its
own checkpoint with nothing lost and nothing trained twice."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from pathlib import Path

import httpx
import pytest
from tests.conftest import wait_until

from agentjet import SwarmClient
from agentjet.runtime.launch import ServerProcess, free_port
from agentjet.settings import GeneratorSettings, LearnerSettings, LoraSettings, ServerConfig, TrainingSettings

pytestmark = pytest.mark.server

ROLES = ["planner", "executor"]
USER = [{"role": "user", "content": "what is 2 + 2?"}]


async def episode(client: SwarmClient, agent: str, reward: float) -> str:
    async with client.episode(task_id=f"task-{agent}") as ep:
        await ep.openai(agent=agent).chat.completions.create(model="tiny", messages=USER, max_tokens=6)
        ep.reward(reward)
    return ep.episode_id


async def group(url: str, agent: str) -> list[str]:
    async with SwarmClient(url) as client:
        return list(await asyncio.gather(*[episode(client, agent, r) for r in (1.0, 0.0)]))


def adapters_status(url: str) -> dict:
    return httpx.get(f"{url}/swarm/v1/status", timeout=30).json()["adapters"]


def test_a_step_of_one_adapter_changes_its_outputs_and_not_the_others(make_server, tiny_model_path: Path) -> None:
    from agentjet.layouts.adapters import adapter_engines

    engine = adapter_engines(tiny_model_path, ROLES, GeneratorSettings(max_batch_size=8),
                             LearnerSettings(learning_rate=0.05, lora=LoraSettings(rank=4, adapters=ROLES)))
    srv = make_server(engine, learner={"learning_rate": 0.05, "lora": {"rank": 4, "adapters": ROLES}})

    async def greedy(agent: str) -> tuple[str, list[float]]:
        async with SwarmClient(srv.url) as client:
            ep = await client.episode(task_id="probe", eval=True).begin()
            reply = await ep.openai(agent=agent).chat.completions.create(
                model="tiny", messages=USER, max_tokens=8, temperature=0, logprobs=True)
            await ep.end(0.0)
            return reply.choices[0].message.content, [t.logprob for t in reply.choices[0].logprobs.content]

    before = {a: asyncio.run(greedy(a)) for a in ROLES}
    asyncio.run(group(srv.url, "planner"))
    wait_until(lambda: srv.server.status().adapters["planner"].train_steps == 1)
    after = {a: asyncio.run(greedy(a)) for a in ROLES}
    assert after["executor"] == before["executor"]  # the same greedy text and the same logprobs
    assert after["planner"][1] != pytest.approx(before["planner"][1], abs=1e-6)
    assert srv.server.status().adapters["executor"].policy_version == 0


def test_a_sigkilled_server_resumes_every_adapter_losing_nothing_training_nothing_twice(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = ServerConfig(model="tiny-random", served_model_name="tiny", port=free_port(), data_dir=data,
                          training=TrainingSettings(group_size=2, batch_groups=1, checkpoint_every=2),
                          learner=LearnerSettings(learning_rate=1e-3, lora=LoraSettings(rank=4, adapters=ROLES)))
    server = ServerProcess("adapters", config, tmp_path / "server.log", tmp_path / "server.yaml").start()
    acknowledged: dict[str, list[str]] = {role: [] for role in ROLES}
    try:
        server.wait_ready(120)
        for expected in (1, 2, 3):  # planner: steps 1 and 2 checkpointed, step 3 not (every 2)
            acknowledged["planner"] += asyncio.run(group(server.url, "planner"))
            wait_until(lambda n=expected: adapters_status(server.url)["planner"]["train_steps"] == n, timeout=60)
        acknowledged["executor"] += asyncio.run(group(server.url, "executor"))  # step 1, not checkpointed
        wait_until(lambda: adapters_status(server.url)["executor"]["train_steps"] == 1, timeout=60)
        server.signal(signal.SIGKILL)
        server.child.popen.wait(30)
    finally:
        server.stop(grace=5)

    config = config.model_copy(update={"resume": True, "port": free_port()})
    again = ServerProcess("adapters-again", config, tmp_path / "again.log", tmp_path / "again.yaml").start()
    try:
        again.wait_ready(120)
        # the uncovered steps' episodes went back to pending and are trained again, once: planner step 3 from
        # its checkpoint at 2, the executor's step 1 from nothing
        wait_until(lambda: adapters_status(again.url)["planner"]["train_steps"] == 3
                   and adapters_status(again.url)["executor"]["train_steps"] == 1, timeout=60)
        status = adapters_status(again.url)
        assert (status["planner"]["policy_version"], status["executor"]["policy_version"]) == (3, 1)
        assert status["planner"]["pending_episodes"] == status["executor"]["pending_episodes"] == 0
    finally:
        again.stop(grace=30)
    log = (tmp_path / "again.log").read_text()
    assert "resumed at step 2 (checkpoint" in log and "adapters/planner/step-000002" in log  # step 3 was rewound
    assert "resumed at step 0 (checkpoint None); 2 episodes consumed after it are pending again" in log
    db = sqlite3.connect(data / "store.sqlite")
    rows = db.execute("SELECT episode_id, adapter, status, consumed_step FROM lane_episodes").fetchall()
    for role, ids in acknowledged.items():  # every acknowledged episode is in the store, trained once by its adapter
        mine = {eid: (st, step) for eid, adapter, st, step in rows if adapter == role}
        assert set(mine) == set(ids) and all(st == "trained" for st, _ in mine.values())
        steps = sorted(step for _, step in mine.values())
        assert steps == sorted([k // 2 + 1 for k in range(len(ids))])  # two episodes per step, each step once
    assert len(rows) == len({(e, a) for e, a, _, _ in rows}) == 8
    episodes = dict(db.execute("SELECT episode_id, status FROM episodes").fetchall())
    assert {episodes[e] for ids in acknowledged.values() for e in ids} == {"trained"}
