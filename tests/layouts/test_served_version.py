"""One consistent status (design §6): the version the status reports is served, its step committed (its episodes
count as trained) and its weights held by the generator; while the push runs, the learner's newer version shows
beside it. Run on the fake vLLM (tests/generators/vllm/fake_vllm.py) with a swap slowed down on purpose."""

from __future__ import annotations

import threading

import httpx
import pytest
from tests.conftest import wait_until
from tests.generators.vllm.fake import fake_config
from tests.generators.vllm.test_vllm_engine import fault
from tests.layouts.test_layouts import _group_settings
from tests.observe.helpers import play_group

from agentjet.layouts import vllm_engine
from agentjet.runtime.blocking import run_blocking


@pytest.fixture(params=[0, 1], ids=["in-process", "trainer-group"])
def engine(request, tiny_model_path, tmp_path):
    """vLLM (the fake) with the in-process learner, or a trainer group (torchrun, gloo: one rank on a CPU)."""
    cfg = fake_config(tiny_model_path, lr=1e-3, train_procs=request.param)
    if request.param:
        cfg.learner.group = cfg.learner.group.model_copy(update=_group_settings(tmp_path))
    engine = vllm_engine(cfg.model_copy(update={"data_dir": tmp_path}), tmp_path / "vllm")
    yield engine
    run_blocking(engine.close())


@pytest.mark.timeout(400)
def test_a_client_that_waits_for_version_n_finds_n_trained_and_served(make_server, engine) -> None:
    fault(engine, pause_delay_s=1.5)  # every weight swap takes at least 1.5 s: the push is in flight that long
    srv = make_server(engine)  # group_size 2, batch_groups 1: one group is one step
    seen: list[tuple[dict, int]] = []  # (the status, the generator's version once it was answered)
    others: list[tuple[int, int]] = []  # (/health's or /v1/models' version, the generator's once answered)
    eval_tags: list[int] = []  # the version an eval begun during the push is tagged with
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            while not stop.is_set():
                status = http.get("/swarm/v1/status").json()
                named = [http.get("/health").json()["policy_version"],
                         http.get("/v1/models").json()["data"][0]["policy_version"]]
                seen.append((status, engine.generator.policy_version))
                others.extend((v, engine.generator.policy_version) for v in named)
                if status.get("weight_push_in_flight") and not eval_tags:
                    ep = http.post("/swarm/v1/episodes", json={"client_id": "evals", "task_id": "e1", "eval": True})
                    eval_tags.append(ep.json()["policy_version"])

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        play_group(srv.url, "t1", [1.0, 0.0])
        # a client that waits for version 1 ...
        wait_until(lambda: bool(seen) and seen[-1][0]["policy_version"] >= 1, timeout=240, interval=0.01)
        status = httpx.get(f"{srv.url}/swarm/v1/status").json()
        # ... finds version 1's episodes trained and its weights served
        assert status["buffer"]["trained_episodes"] == 2 and status["train_steps"] == 1
        assert engine.generator.policy_version == 1
        assert httpx.get(f"{srv.url}/health").json()["policy_version"] == 1
    finally:
        stop.set()
        poller.join(timeout=30)

    for st, generator_version in seen:  # at every moment the status was read
        n = st["policy_version"]
        assert st["buffer"]["trained_episodes"] >= 2 * n, st  # n's episodes already count as trained
        assert st["train_steps"] >= n
        assert generator_version >= n  # the generator held n's weights when the status named n
    assert all(v <= generator_version for v, generator_version in others)  # /health and /v1/models: the same rule
    pushing = [st for st, _ in seen if st["weight_push_in_flight"]]
    assert pushing, "the status never showed the 1.5 s push in flight"
    for st in pushing:  # the learner's newer version beside the served one, whose step is not committed yet
        assert (st["policy_version"], st["learner_version"]) == (0, 1), st
        assert st["buffer"]["trained_episodes"] == 0 and st["train_steps"] == 0
    assert eval_tags == [0]  # an eval begun meanwhile names the weights that generate it, not the learner's
    last = seen[-1][0]
    assert (last["policy_version"], last["learner_version"], last["weight_push_in_flight"]) == (1, 1, False)
