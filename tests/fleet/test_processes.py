"""Replicas on this machine (``--generator-replicas 2``: two engine processes, ``generators/hf/engine_process``; the
tiny model): they serve calls and keep an episode on one of them; a push reaches both; a replica SIGKILLed in the
middle of a call hands it on (the call goes on on the other from the tokens it had), and it is restarted, caught up
to the newest weights and serves again."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from agentjet.engines.base import SamplingParams, TrainSample
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import FleetSettings, GeneratorSettings, LearnerSettings, ServerConfig


def fleet_config(model: Path, data_dir: Path, replicas: int = 2, **fleet) -> ServerConfig:
    settings = {"threads": 1, "health_interval_s": 0.2, "restart_backoff_s": 0.1, "startup_timeout_s": 120, **fleet}
    return ServerConfig(model=str(model), data_dir=data_dir, learner=LearnerSettings(learning_rate=1e-3),
                        generator=GeneratorSettings(replicas=replicas, max_batch_size=4,
                                                    fleet=FleetSettings(**settings)))


def wait_for(check, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def fleet_engine(tiny_model_path: Path, tmp_path: Path):
    from agentjet.layouts import build_engine

    engines = []

    def make(**kwargs):
        engine = build_engine(fleet_config(tiny_model_path, tmp_path / f"run{len(engines)}", **kwargs))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        run_blocking(engine.close())


def sample(ids: list[int]) -> TrainSample:
    n = len(ids)
    return TrainSample(ids, [0] + [1] * (n - 1), [-1.0] * n, [0.5] * n)


def test_replica_processes_serve_train_and_survive_a_sigkill(fleet_engine) -> None:
    engine = fleet_engine()
    fleet = engine.generator
    status = fleet.fleet()
    assert [r.state for r in status.replicas] == ["serving", "serving"]
    assert all(r.where.startswith("engine process ") for r in status.replicas)
    tok = engine.tokenizer
    ids = tok.encode("a prompt that starts an episode")
    short = SamplingParams(max_tokens=4)

    async def episode(i: int) -> None:
        for k in range(2):
            await engine.generate(ids + tok.encode(f" {i} {k}"), short, session=f"ep{i}")

    async def episodes() -> None:
        import asyncio

        await asyncio.gather(*(episode(i) for i in range(4)))

    run_blocking(episodes())
    status = fleet.fleet()
    assert (status.affinity_hits, status.new_sessions) == (4, 4) and [r.sessions for r in status.replicas] == [2, 2]

    # a train step: its push reaches both replicas before v1 is served
    out = run_blocking(engine.train_step([sample(ids + [5, 6, 7])]))
    assert out["policy_version"] == 1 and out["replicas_pushed"] == 2
    assert fleet.policy_version == 1 and [r.policy_version for r in fleet.fleet().replicas] == [1, 1]

    # SIGKILL r0 in the middle of a call of its episode
    home = fleet.slots.router.replica_of("ep0")
    victim = next(s for s in fleet.slots.all() if s.name == home).replica
    pid = victim.generator.child.pid
    streamed: list[int] = []

    def on_token(token: int, _lp: float) -> None:
        streamed.append(token)
        if len(streamed) == 8:
            os.kill(pid, signal.SIGKILL)

    long = SamplingParams(max_tokens=120, temperature=1.0)
    result = run_blocking(engine.generate(ids, long, on_token=on_token, session="ep0"))
    status = fleet.fleet()
    assert status.failovers == 1 and status.failover_tokens >= 8
    assert len(result.token_ids) > status.failover_tokens and streamed == result.token_ids
    assert len(result.logprobs) == len(result.versions) == len(result.token_ids)
    assert set(result.versions) == {1}  # every token from v1 weights, on either replica
    assert fleet.slots.router.replica_of("ep0") != home  # the episode moved with its call

    # the killed replica is restarted, caught up to v1 and serves again
    wait_for(lambda: next(r for r in fleet.fleet().replicas if r.name == home).state == "serving", 120,
             "the killed replica to serve again")
    back = next(r for r in fleet.fleet().replicas if r.name == home)
    assert back.restarts == 1 and back.policy_version == 1 and back.failed_calls == 1
    assert victim.generator.child.pid != pid
    assert run_blocking(engine.generate(ids, short, session="new")).token_ids
