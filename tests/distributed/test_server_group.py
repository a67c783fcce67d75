"""The swarm server with a trainer group behind it (``ajet server --train-procs``): rollouts from the embedded
engine, steps on the group, weights pushed back after each step; a rank killed between steps costs a retry,
not an episode; a checkpoint resumes on a new server."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import pytest
import torch
from tests.conftest import wait_until

from agentjet import SwarmClient
from agentjet.distributed import LearnerGroupSettings
from agentjet.layouts import group_engine as build_group_engine
from agentjet.layouts.composed import ComposedEngine
from agentjet.settings import ServerConfig

pytestmark = pytest.mark.timeout(400)

USER = [{"role": "user", "content": "what is 2 + 2?"}]


async def episode(client: SwarmClient, task_id: str, reward: float) -> str:
    async with client.episode(task_id=task_id) as ep:
        await ep.openai().chat.completions.create(model="tiny", messages=USER, max_tokens=8)
        ep.reward(reward)
    return ep.episode_id


def run_group(srv, task_id: str) -> list[str]:
    async def main() -> list[str]:
        async with SwarmClient(srv.url) as client:
            return await asyncio.gather(*[episode(client, task_id, r) for r in (1.0, 0.0)])

    return asyncio.run(main())


def group_engine(model: Path, work: Path) -> ComposedEngine:
    settings = LearnerGroupSettings(procs=1, work_dir=work, export_dir=work / "export", startup_timeout_s=120,
                                    step_timeout_s=60, push_timeout_s=60, collective_timeout_s=30)
    config = ServerConfig.model_validate({"model": str(model), "data_dir": str(work),
                                          "learner": {"learning_rate": 1e-3, "group": settings}})
    return build_group_engine(config)


def test_server_trains_through_a_group_survives_a_dead_rank_and_resumes(make_server, tiny_model_path,
                                                                        tmp_path: Path) -> None:
    data = tmp_path / "server"
    engine = group_engine(tiny_model_path, tmp_path / "g1")
    srv = make_server(engine, data_dir=data, training={"group_size": 2, "batch_groups": 1, "checkpoint_every": 1})
    rollout = engine.generator
    before = {k: v.clone() for k, v in rollout.model.state_dict().items()}

    first = run_group(srv, "a")
    latest = data / "checkpoints" / "latest"
    wait_until(lambda: latest.exists() and latest.read_text().strip() == "step-000001", timeout=120)
    assert engine.policy_version == 1 and rollout.policy_version == 1
    metrics = httpx.get(f"{srv.url}/swarm/v1/status").json()["last_train_metrics"]
    # the group trained on exactly the logprobs the rollout engine sampled with: same model, same weights
    assert metrics["mean_abs_logprob_diff"] < 1e-3 and metrics["ranks"] == 1
    after = rollout.model.state_dict()
    assert any(not torch.equal(after[k], before[k]) for k in before)  # the new weights reached the rollouts

    _, _, pid = engine.learner.group.rank_processes[0]
    os.kill(pid, signal.SIGKILL)  # dies between steps: the next step fails, its episodes stay pending
    second = run_group(srv, "b")
    wait_until(lambda: engine.policy_version == 2, timeout=200)
    assert engine.learner.group.counters["faults"] == 1 and engine.learner.group.counters["restarts"] == 1
    wait_until(lambda: latest.read_text().strip() == "step-000002", timeout=60)
    consumed = srv.server.store.consumed_steps()
    assert {i: consumed[i] for i in first} == {i: [1] for i in first}
    assert {i: consumed[i] for i in second} == {i: [2] for i in second}  # trained once, by step 2
    weights = {k: v.clone() for k, v in rollout.model.state_dict().items()}
    srv.stop()
    assert engine.learner.group.exit_codes[-1] == 0

    engine2 = group_engine(tiny_model_path, tmp_path / "g2")
    srv2 = make_server(engine2, data_dir=data, resume=True, training={"group_size": 2, "batch_groups": 1})
    assert engine2.policy_version == 2 and engine2.generator.policy_version == 2
    for k, v in engine2.generator.model.state_dict().items():
        assert torch.equal(v, weights[k])
    run_group(srv2, "c")
    wait_until(lambda: engine2.policy_version == 3, timeout=120)
    srv2.stop()
