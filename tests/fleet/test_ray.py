"""Two machines simulated on one host with Ray (opt-in: ``make test-ray``; the ray extra): ``ajet server --ray
ADDRESS --generator-replicas 2`` on a local two-node cluster (``ray.cluster_utils.Cluster``, a head and a worker,
two replica slots each), each replica a Ray actor running its replica process on its node, spread over the two.
The demo task trains while the worker node is removed in the middle of its replica's calls: the replica is out of
rotation at once, its calls go on on the head's, it is replaced by a new actor on the head (the node with room),
caught up to the newest weights; no episode is lost and no call sees a 5xx."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402
from tests.fleet.harness import demo_load, lost_episodes, start_server, wait_status, when_busy  # noqa: E402

import agentjet  # noqa: E402
from agentjet.settings import (  # noqa: E402
    FleetSettings,
    GeneratorSettings,
    LearnerSettings,
    ServerConfig,
    TrainingSettings,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]
SRC = Path(agentjet.__file__).resolve().parents[1]


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch):
    # the nodes' workers (and the server, a Ray driver) import this checkout's agentjet
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]))
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"replica_slot": 2}})
    c.add_node(num_cpus=2, resources={"replica_slot": 2})
    c.wait_for_nodes()
    yield c
    c.shutdown()


def node_of(where: str) -> str:
    return where.split("(")[1].split(")")[0]  # "Ray actor on node IP (NODEID8), process PID"


def test_replicas_on_a_two_node_ray_cluster_survive_a_lost_node(tiny_model_path: Path, tmp_path: Path,
                                                                 cluster: Cluster) -> None:
    head, (worker,) = cluster.head_node, cluster.worker_nodes
    config = ServerConfig(
        model=str(tiny_model_path), data_dir=tmp_path / "data", log_level="WARNING",
        learner=LearnerSettings(learning_rate=1e-3),
        training=TrainingSettings(group_size=4, batch_groups=1, checkpoint_every=0),
        generator=GeneratorSettings(replicas=2, max_batch_size=8, fleet=FleetSettings(
            ray=cluster.address, cpus=0.5, resources={"replica_slot": 1}, threads=1, health_interval_s=0.2,
            restart_backoff_s=0.1)))
    server = start_server(config, tmp_path, env={"PYTHONPATH": os.environ["PYTHONPATH"]})
    try:
        s, _ = wait_status(server.url, lambda s: s.fleet is not None and s.fleet.serving == 2, 300, "two replicas")
        nodes = {r.name: node_of(r.where) for r in s.fleet.replicas}
        assert set(nodes.values()) == {head.node_id[:8], worker.node_id[:8]}, nodes  # one replica on each node
        on_worker = next(name for name, node in nodes.items() if node == worker.node_id[:8])

        async def run() -> tuple:
            load_task = asyncio.ensure_future(demo_load(server.url, episodes=64, concurrency=8))
            await when_busy(server.url, on_worker, 8, load_task)  # the node dies while its replica generates
            lost_at = time.monotonic()
            await asyncio.to_thread(cluster.remove_node, worker, False)
            return await load_task, lost_at

        load, lost_at = asyncio.run(run())
        assert load.failed == [] and load.server_errors == 0 and load.statuses == {200: 64}
        s, back_at = wait_status(server.url, lambda s: next(r for r in s.fleet.replicas
                                                            if r.name == on_worker).state == "serving", 300,
                                 "the lost node's replica to be replaced")
        replaced = next(r for r in s.fleet.replicas if r.name == on_worker)
        assert node_of(replaced.where) == head.node_id[:8] and replaced.restarts >= 1  # a new actor, on the head
        s, _ = wait_status(server.url, lambda s: s.buffer.pending_episodes == 0 and s.buffer.open_episodes == 0,
                           120, "the last batch to train")
        assert lost_episodes(load, s) == 0 and s.throughput["episodes_ended"] == 64
        assert s.train_steps >= 4 and s.policy_version == s.train_steps
        assert [r.policy_version for r in s.fleet.replicas] == [s.policy_version] * 2 and s.fleet.serving == 2
        print(f"\n[ray fleet] replaced after {back_at - lost_at:.1f} s; failovers {s.fleet.failovers}; "
              f"{s.train_steps} steps")
    finally:
        server.stop(grace=30)
