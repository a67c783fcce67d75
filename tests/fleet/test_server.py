"""A swarm server over a fleet: the router's counts in the status, the dashboard and Prometheus (one read model),
a version served only once every replica holds it, and, on two engine processes (``--generator-replicas 2``), one
SIGKILLed in the middle of a streamed call: the client's stream completes (no 5xx), the call is recorded with every
token and its behaviour logprob, the replica comes back, and the next step's push reaches both."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import threading
from pathlib import Path

import httpx
import pytest
from tests.conftest import wait_until
from tests.observe.helpers import ADMIN, READ, play_group

from agentjet.generators.fleet import FleetGenerator, FleetSync, Weights
from agentjet.layouts.composed import ComposedEngine
from agentjet.layouts.fleet import hf_replica
from agentjet.learners.inprocess import InProcessLearner
from agentjet.observe import ObserveSettings
from agentjet.protocol import ServerStatus
from agentjet.settings import FleetSettings, GeneratorSettings, LearnerSettings, LossSettings, ServerConfig


def fleet_config(model: Path, data_dir: Path, replicas: int = 2, **fleet) -> ServerConfig:
    settings = {"threads": 1, "health_interval_s": 0.2, "restart_backoff_s": 0.1, "startup_timeout_s": 120, **fleet}
    return ServerConfig(model=str(model), data_dir=data_dir, learner=LearnerSettings(learning_rate=1e-3),
                        generator=GeneratorSettings(replicas=replicas, max_batch_size=4,
                                                    fleet=FleetSettings(**settings)))


def in_process_fleet(model: Path, tmp_path: Path, n: int = 2) -> ComposedEngine:
    """n embedded replicas in this process, the in-process learner's own copy, the fleet's seam."""
    from agentjet.engines.model import load_policy_model, model_facts

    facts = model_facts(model)
    replicas = [hf_replica(f"r{i}", model, GeneratorSettings(max_batch_size=8)) for i in range(n)]
    fleet = FleetGenerator(facts.tokenizer, facts.context_length, facts.stop_ids,
                           FleetSettings(health_interval_s=0.5, restart_backoff_s=0.05), "hf")
    fleet.start(replicas)
    learner = InProcessLearner(load_policy_model(model), LearnerSettings(learning_rate=1e-3), LossSettings(),
                               export_root=tmp_path / "exports")
    return ComposedEngine(fleet, learner, FleetSync(60.0))


def _metric(text: str, name: str) -> float:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(name + " ")]
    return float(line.split()[1])


def test_status_dashboard_and_metrics_show_the_same_replicas(make_server, tiny_model_path: Path,
                                                             tmp_path: Path) -> None:
    engine = in_process_fleet(tiny_model_path, tmp_path)
    srv = make_server(engine=engine, admin_token=ADMIN, observe=ObserveSettings(read_token=READ))
    play_group(srv.url, "t1", [1.0, 0.0], turns=2)
    wait_until(lambda: srv.server.counters.training.train_steps == 1, timeout=60)
    status = ServerStatus.model_validate(httpx.get(f"{srv.url}/swarm/v1/status",
                                                   headers={"Authorization": f"Bearer {ADMIN}"}).json())
    read = {"Authorization": f"Bearer {READ}"}
    snap = httpx.get(f"{srv.url}/dashboard/api/run", params={"evals": "false"}, headers=read).json()["snapshot"]
    prom = httpx.get(f"{srv.url}/metrics", headers=read).text
    f = status.fleet
    assert f is not None and f.model_dump() == snap["fleet"]
    assert status.policy_version == 1 and [r.policy_version for r in f.replicas] == [1, 1]
    assert [r.pushes for r in f.replicas] == [1, 1] and all(r.last_push_s > 0 for r in f.replicas)
    # two episodes of two calls: each episode on one replica, the second call of each by affinity
    assert (f.routed_calls, f.affinity_hits, f.new_sessions) == (4, 2, 2)
    assert sorted(r.sessions for r in f.replicas) == [1, 1] and sum(r.calls for r in f.replicas) == 4
    assert _metric(prom, "agentjet_fleet_replicas_serving") == f.serving == 2
    assert _metric(prom, "agentjet_router_affinity_hits_total") == f.affinity_hits
    for r in f.replicas:
        assert _metric(prom, f'agentjet_replica_calls_total{{replica="{r.name}"}}') == r.calls
        assert _metric(prom, f'agentjet_replica_policy_version{{replica="{r.name}"}}') == r.policy_version
        assert _metric(prom, f'agentjet_replica_state{{replica="{r.name}",state="serving"}}') == 1
    assert status.engine == "fleet+in-process" and status.weight_syncs == 1


def test_a_version_is_served_only_once_every_replica_holds_it(make_server, tiny_model_path: Path,
                                                              tmp_path: Path) -> None:
    engine = in_process_fleet(tiny_model_path, tmp_path)
    fleet: FleetGenerator = engine.generator
    slow = fleet.slots.all()[1].replica
    gate = threading.Event()
    real_load = slow.load

    async def gated(weights: Weights) -> None:
        await asyncio.to_thread(gate.wait)
        await real_load(weights)

    slow.load = gated
    srv = make_server(engine=engine)
    play_group(srv.url, "t1", [1.0, 0.0])
    wait_until(lambda: fleet.slots.all()[0].version == 1, timeout=60)  # one replica holds v1 ...
    for _ in range(3):
        health = httpx.get(f"{srv.url}/health").json()
        status = httpx.get(f"{srv.url}/swarm/v1/status").json()
        assert health["policy_version"] == status["policy_version"] == 0  # ... so v1 is not served
        assert status["learner_version"] == 1 and status["weight_push_in_flight"] is True
    gate.set()
    wait_until(lambda: httpx.get(f"{srv.url}/health").json()["policy_version"] == 1, timeout=60)
    assert [s.version for s in fleet.slots.all()] == [1, 1]  # served: every replica holds it


@pytest.mark.timeout(600)
def test_a_replica_killed_during_a_streamed_call_loses_no_token_and_comes_back(make_server, tiny_model_path: Path,
                                                                               tmp_path: Path) -> None:
    from agentjet.layouts import build_engine

    engine = build_engine(fleet_config(tiny_model_path, tmp_path / "fleet"))
    fleet: FleetGenerator = engine.generator
    srv = make_server(engine=engine)
    ep = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "c1", "task_id": "t"}).json()
    headers = {"Authorization": f"Bearer {ep['api_key']}"}
    body = {"model": "agent", "messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 150,
            "temperature": 1.0, "stream": True, "stream_options": {"include_usage": True}}
    chunks, killed = [], None
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", headers=headers, json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks.append(json.loads(line[6:]))
            if len(chunks) == 6 and killed is None:  # a few tokens in: SIGKILL the replica generating it
                home = fleet.slots.router.replica_of(ep["episode_id"])
                victim = next(s for s in fleet.slots.all() if s.name == home).replica
                killed = (home, victim.generator.child.pid)
                os.kill(killed[1], signal.SIGKILL)
    assert killed is not None and all("error" not in c for c in chunks)
    usage = next(c["usage"] for c in chunks if c.get("usage"))
    f = fleet.fleet()
    assert f.failovers == 1 and 0 < f.failover_tokens < usage["completion_tokens"]
    r = httpx.post(f"{srv.url}/swarm/v1/episodes/{ep['episode_id']}/end", headers=headers, json={"reward": 1.0})
    assert r.status_code == 200
    (sample,) = srv.server.store.samples_for([ep["episode_id"]])[ep["episode_id"]]
    trained = [lp for lp, m in zip(sample.behaviour_logprobs, sample.loss_mask, strict=True) if m]
    assert len(trained) == usage["completion_tokens"]  # every token of the reply, from both replicas, recorded
    assert all(math.isfinite(lp) and lp <= 0 for lp in trained)
    home = killed[0]
    wait_until(lambda: next(r for r in fleet.fleet().replicas if r.name == home).state == "serving", timeout=120)
    back = next(r for r in fleet.fleet().replicas if r.name == home)
    assert back.restarts == 1 and back.failed_calls == 1 and back.where != f"engine process {killed[1]} on this machine"

    # the episode's group completes: a train step, its push to both engine processes, v1 served
    other = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "c1", "task_id": "t"}).json()
    auth = {"Authorization": f"Bearer {other['api_key']}"}
    r = httpx.post(f"{srv.url}/v1/chat/completions", headers=auth, timeout=120,
                   json={"model": "agent", "messages": body["messages"], "max_tokens": 8})
    assert r.status_code == 200
    httpx.post(f"{srv.url}/swarm/v1/episodes/{other['episode_id']}/end", headers=auth, json={"reward": 0.0})
    wait_until(lambda: httpx.get(f"{srv.url}/health").json()["policy_version"] == 1, timeout=120)
    assert [r.policy_version for r in fleet.fleet().replicas] == [1, 1]
    assert all(r.pushes == 1 and r.last_push_s > 0 for r in fleet.fleet().replicas)
