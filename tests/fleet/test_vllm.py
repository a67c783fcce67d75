"""N vLLM servers behind the router (``--engine vllm --generator-replicas 2``; the fake vLLM of tests/generators/vllm, a
real tiny model behind vLLM's routes): both serve, a push reloads and probes each, and a replica whose probe fails
(it kept its old weights) is taken out of rotation instead of halting training, then restarted and caught up."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from tests.generators.vllm.fake import fake_config

from agentjet.engines.base import SamplingParams, TrainSample
from agentjet.layouts import build_engine
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import FleetSettings


def sample(ids: list[int]) -> TrainSample:
    n = len(ids)
    return TrainSample(ids, [0] + [1] * (n - 1), [-1.0] * n, [0.5] * n)


def test_two_vllm_replicas_a_failed_probe_takes_one_out_without_halting(tiny_model_path: Path,
                                                                       tmp_path: Path) -> None:
    config = fake_config(tiny_model_path, lr=1e-2)
    gen = config.generator.model_copy(update={"replicas": 2, "fleet": FleetSettings(
        health_interval_s=0.2, restart_backoff_s=0.1, startup_timeout_s=120, max_restarts=2)})
    engine = build_engine(config.model_copy(update={"generator": gen, "data_dir": tmp_path}))
    fleet = engine.generator
    try:
        status = fleet.fleet()
        assert [r.state for r in status.replicas] == ["serving", "serving"]
        assert all(r.where.startswith("vLLM at http://") for r in status.replicas)
        tok = engine.tokenizer
        ids = tok.encode("hello there, a prompt")
        for i in range(4):
            assert run_blocking(engine.generate(ids, SamplingParams(max_tokens=3), session=f"ep{i}")).token_ids
        assert sorted(r.sessions for r in fleet.fleet().replicas) == [2, 2]
        out = run_blocking(engine.train_step([sample(ids + [5, 6, 7])]))
        assert out["replicas_pushed"] == 2 and fleet.policy_version == 1 and engine.halted_reason is None

        bad = fleet.fleet().replicas[1]
        url = next(s for s in fleet.slots.all() if s.name == bad.name).replica.generator.url
        httpx.post(f"{url}/fault", json={"ignore_reload": True}).raise_for_status()  # it keeps v1's weights
        out = run_blocking(engine.train_step([sample(ids + [8, 9, 10])]))
        assert out["replicas_pushed"] == 1 and out["replica_push_failures"] == 1  # the step is not halted
        assert engine.halted_reason is None and engine.policy_version == 2
        assert fleet.policy_version == 2  # the replica in rotation holds v2: served
        deadline = time.monotonic() + 180
        while next(r for r in fleet.fleet().replicas if r.name == bad.name).state != "serving":
            assert time.monotonic() < deadline, fleet.fleet()
            time.sleep(0.1)
        back = next(r for r in fleet.fleet().replicas if r.name == bad.name)
        assert back.policy_version == 2 and back.restarts == 1 and "probe" in (back.out_reason or "")
        assert run_blocking(engine.train_step([sample(ids + [11, 12])]))["replicas_pushed"] == 2
    finally:
        run_blocking(engine.close())
