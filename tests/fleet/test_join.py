"""Two machines simulated on one host, without Ray: ``ajet server`` starts no replica of its own and listens for
them (``--generator-replicas 0 --replica-listen HOST:PORT``); two ``ajet generator --join`` processes join by
hand. The demo task trains while one of them is SIGKILLed in the middle of its calls and started again by its
"operator": no episode is lost, no call sees a 5xx, and the replica serves again under its name."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.fleet.harness import (
    demo_load,
    lost_episodes,
    replica_state,
    start_server,
    status,
    wait_status,
    when_busy,
)

from agentjet.generators.fleet.wire import TOKEN_ENV
from agentjet.runtime.launch import free_port
from agentjet.settings import (
    FleetSettings,
    GeneratorSettings,
    LearnerSettings,
    ServerConfig,
    TrainingSettings,
)

pytestmark = pytest.mark.timeout(600)
SECRET = "join-test-" + "s" * 24


def join(address: str, name: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, TOKEN_ENV: SECRET}
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, "-m", "agentjet.cli", "generator", "--join", address, "--name", name,
                                 "--threads", "1", "--log-level", "WARNING"], env=env, stdout=f,
                                stderr=subprocess.STDOUT)


def test_replicas_that_join_by_hand_train_the_demo_and_one_lost_mid_run_loses_no_episode(
        tiny_model_path: Path, tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    config = ServerConfig(
        model=str(tiny_model_path), data_dir=tmp_path / "data", log_level="WARNING",
        learner=LearnerSettings(learning_rate=1e-3),
        training=TrainingSettings(group_size=4, batch_groups=1, checkpoint_every=0),
        generator=GeneratorSettings(replicas=0, max_batch_size=8, fleet=FleetSettings(
            listen=address, token=SECRET, health_interval_s=0.2, restart_backoff_s=0.1)))
    server = start_server(config, tmp_path)
    machines = {name: join(address, name, tmp_path / f"{name}.log") for name in ("m1", "m2")}
    try:
        wait_status(server.url, lambda s: s.fleet is not None and s.fleet.serving == 2, 180, "both to join")
        before = status(server.url)
        assert all(r.where.startswith("joined from ") for r in before.fleet.replicas)

        async def run() -> tuple:
            load_task = asyncio.ensure_future(demo_load(server.url, episodes=64, concurrency=8))
            await when_busy(server.url, "m1", 8, load_task)  # kill m1 while it generates, a few episodes in:
            os.kill(machines["m1"].pid, signal.SIGSTOP)  # frozen first, so that calls are surely in flight on it
            await when_busy(server.url, "m1", 8, load_task)
            os.kill(machines["m1"].pid, signal.SIGKILL)
            killed_at = time.monotonic()
            machines["m1"].wait(timeout=30)
            machines["m1"] = join(address, "m1", tmp_path / "m1.log")  # its operator starts it again
            return await load_task, killed_at

        load, killed_at = asyncio.run(run())
        assert load.failed == [] and load.server_errors == 0 and load.statuses == {200: 64}
        _, back_at = wait_status(server.url, lambda s: replica_state(s, "m1") == "serving", 180, "m1 to serve again")
        s, _ = wait_status(server.url, lambda s: s.buffer.pending_episodes == 0 and s.buffer.open_episodes == 0,
                           120, "the last batch to train")
        assert lost_episodes(load, s) == 0 and s.throughput["episodes_ended"] == 64
        assert s.train_steps >= 4 and s.policy_version == s.train_steps
        m1 = next(r for r in s.fleet.replicas if r.name == "m1")
        assert m1.restarts == 1 and m1.policy_version == s.policy_version  # caught up when it came back
        assert s.fleet.failovers >= 1  # the calls it had in flight went on on m2
        assert back_at > killed_at
    finally:
        server.stop(grace=30)
        for proc in machines.values():
            if proc.poll() is None:
                proc.kill()
