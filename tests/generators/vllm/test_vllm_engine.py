"""VLLMEngine against a fake vLLM server (tests/generators/vllm/fake_vllm.py, a subprocess on a free port, backed by the
tiny model): generation, the weight-sync sequence and its timeout, the probe threshold, LoRA versions, and a
crash mid-request."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from tests.conftest import wait_until

from agentjet.engines.base import SamplingParams, TrainSample
from agentjet.engines.errors import EngineUnavailableError, GenerationError, TrainingHaltedError
from agentjet.generators.vllm.process import ProcessState
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import LoraSettings


def calls(engine) -> list[dict]:
    return httpx.get(f"{engine.generator.url}/calls").json()


def fault(engine, **kw) -> None:
    httpx.post(f"{engine.generator.url}/fault", json=kw).raise_for_status()


def prompt(engine, text: str = "What is 2 + 3?") -> list[int]:
    return list(engine.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                     tokenize=True, return_dict=False))


async def rollout_batch(engine, n: int = 2) -> list[TrainSample]:
    """Samples made from the engine's own generations, advantages +1 / -1."""
    ids = prompt(engine)
    out = []
    for i in range(n):
        res = await engine.generate(ids, SamplingParams(temperature=1.0, max_tokens=8, seed=i))
        seq = ids + res.token_ids
        mask = [0] * len(ids) + [1] * len(res.token_ids)
        beh = [0.0] * len(ids) + res.logprobs
        adv = [(1.0 if i % 2 == 0 else -1.0) * m for m in mask]
        out.append(TrainSample(seq, mask, beh, adv))
    return out


def test_generate_gives_vllm_ids_and_true_logprobs(shared_vllm_engine):
    engine = shared_vllm_engine
    ids = prompt(engine)

    async def go():
        a = await engine.generate(ids, SamplingParams(temperature=0.7, max_tokens=12, seed=5, top_logprobs=3))
        b = await engine.generate(ids, SamplingParams(temperature=0.7, max_tokens=12, seed=5))
        streamed: list[tuple[int, float]] = []
        c = await engine.generate(ids, SamplingParams(temperature=0.7, max_tokens=12, seed=5),
                                  on_token=lambda t, lp: streamed.append((t, lp)))
        return a, b, c, streamed

    a, b, c, streamed = asyncio.run(go())
    assert a.token_ids == b.token_ids == c.token_ids and len(a.token_ids) >= 1
    assert streamed == list(zip(c.token_ids, c.logprobs, strict=True))
    assert a.policy_version == 0
    assert a.top_logprobs is not None and len(a.top_logprobs) == len(a.token_ids)
    assert all(len(row) == 3 and row[0][1] >= row[-1][1] for row in a.top_logprobs)
    # the behaviour logprobs are the sampler's, at T=0.7: the trainer scores the same tokens the same way
    seq = ids + a.token_ids
    sample = TrainSample(seq, [0] * len(ids) + [1] * len(a.token_ids), [0.0] * len(seq), [0.0] * len(seq),
                         temperature=0.7)
    assert run_blocking(engine.learner.score([sample]))[0] == pytest.approx(a.logprobs, abs=1e-4)
    assert a.text == engine.tokenizer.decode(a.token_ids, skip_special_tokens=True)


def test_request_body_asks_for_ids_logprobs_and_our_stop_rule(shared_vllm_engine):
    engine = shared_vllm_engine
    body = engine.generator.request_body([1, 2, 3], SamplingParams(temperature=0.5, max_tokens=5000, top_k=7, seed=3,
                                                         stop=("\n",), stop_token_ids=(9,)), "policy")
    assert body["return_token_ids"] and body["return_tokens_as_token_ids"] and body["logprobs"] == 1
    assert body["max_tokens"] == engine.max_context - 3  # clipped to the context window
    assert body["ignore_eos"] and set(body["stop_token_ids"]) == engine.generator.stop_token_ids | {9}
    assert (body["top_k"], body["seed"], body["stop"]) == (7, 3, ["\n"])


def test_bad_prompts_are_value_errors(shared_vllm_engine):
    engine = shared_vllm_engine
    with pytest.raises(ValueError, match="token ids"):
        asyncio.run(engine.generate([len(engine.tokenizer) + 5], SamplingParams()))
    with pytest.raises(ValueError, match="context"):
        asyncio.run(engine.generate([1] * engine.max_context, SamplingParams()))
    with pytest.raises(ValueError, match="empty"):
        asyncio.run(engine.generate([], SamplingParams()))


def test_a_named_adapter_is_refused_naming_the_model(shared_vllm_engine):
    """Named LoRA adapters are the embedded engine's for now: vLLM refuses one as a bad ``model``."""
    with pytest.raises(GenerationError, match="one policy") as refused:
        asyncio.run(shared_vllm_engine.generate([1, 2, 3], SamplingParams(max_tokens=1), adapter="planner"))
    assert refused.value.param == "model"


def test_train_step_syncs_weights_in_order_and_probe_agrees(make_vllm_engine):
    engine = make_vllm_engine()

    async def go():
        batch = await rollout_batch(engine)
        metrics = await engine.train_step(batch)
        after = await engine.generate(prompt(engine), SamplingParams(max_tokens=4, seed=1))
        return metrics, after

    metrics, after = asyncio.run(go())
    seq = [c for c in calls(engine) if c["route"] in ("pause", "collective_rpc", "reset_prefix_cache", "resume")]
    assert [c["route"] for c in seq] == ["pause", "collective_rpc", "reset_prefix_cache", "resume"]
    assert seq[0]["mode"] == "keep" and seq[2]["reset_running_requests"] is True
    weights_dir = seq[1]["kwargs"]["weights_path"]
    assert seq[1]["method"] == "reload_weights" and weights_dir.endswith("/weights/v000001")
    config = json.loads(Path(weights_dir, "config.json").read_text())
    assert config["tie_word_embeddings"] is False  # untied export (see weights.py)
    assert engine.policy_version == 1 and after.policy_version == 1
    assert metrics["policy_version"] == 1.0
    assert metrics["probe_logprob_diff"] < 1e-3  # the fake serves the trained weights exactly
    for key in ("mismatch_kl", "is_weight_mean", "sync_seconds", "export_seconds", "loss", "grad_norm"):
        assert key in metrics
    assert metrics["mismatch_kl"] < 1e-6  # fresh samples, same numerics: no mismatch
    assert engine.generator.engine_stats()["syncs"] == 1


def test_generation_waits_for_the_swap_and_sees_the_new_version(make_vllm_engine):
    engine = make_vllm_engine()
    fault(engine, pause_delay_s=1.0)  # the swap takes at least a second

    async def go():
        batch = await rollout_batch(engine)
        step = asyncio.create_task(engine.train_step(batch))
        while not engine.generator.gate.closed:
            await asyncio.sleep(0.01)
        res = await engine.generate(prompt(engine), SamplingParams(max_tokens=3, seed=2))
        assert step.done()  # the request was held until the swap had finished
        await step
        return res

    res = asyncio.run(go())
    assert res.policy_version == 1


def test_a_request_in_flight_across_a_swap_records_both_versions(make_vllm_engine):
    """pause_mode="keep": a request already running when the swap starts finishes after it. Each token carries the
    version served when it arrived: the old one until the new weights are announced, then the new one."""
    engine = make_vllm_engine()
    assert engine.generator.spans_swaps
    engine.generator.stop_token_ids = set()  # runs to max_tokens
    fault(engine, token_delay_s=0.03)  # the request stays in flight across the whole step and swap

    async def go():
        batch = await rollout_batch(engine)
        seen: list[int] = []
        started = asyncio.Event()

        def on_token(_t: int, _lp: float) -> None:
            seen.append(engine.generator.policy_version)
            if len(seen) == 2:
                started.set()

        gen = asyncio.create_task(engine.generate(prompt(engine), SamplingParams(max_tokens=150, seed=3),
                                                  on_token=on_token))
        await started.wait()
        await engine.train_step(batch)
        before = len(seen)
        return await gen, before

    res, before = asyncio.run(go())
    assert res.policy_version == 0 and len(res.token_ids) == 150
    assert set(res.versions) == {0, 1} and res.versions == sorted(res.versions)
    assert 2 <= res.versions.index(1) <= before  # the change lies between the start of the step and its end


def test_requests_cannot_span_a_swap_when_paused_by_draining_or_on_lora(make_vllm_engine):
    """pause_mode="wait" drains running requests before the swap, and a LoRA request keeps its adapter to the
    end: neither records versions per token (all are the start version)."""
    wait = make_vllm_engine(pause_mode="wait")
    assert not wait.generator.spans_swaps
    res = asyncio.run(wait.generate(prompt(wait), SamplingParams(max_tokens=4, seed=1)))
    assert res.token_versions is None and res.versions == [0] * len(res.token_ids)
    lora = make_vllm_engine(lora=LoraSettings(rank=4, alpha=8))
    assert not lora.generator.spans_swaps


def test_token_versions_off_sends_keep_mode_requests_unstreamed(make_vllm_engine):
    """generator.vllm.token_versions false: a keep-mode request may still span a swap, but it is not streamed from
    vLLM (the throughput it costs), so its tokens carry no versions of their own: all count as its start version."""
    engine = make_vllm_engine(token_versions=False)
    assert engine.generator.spans_swaps and not engine.generator.records_token_versions
    res = asyncio.run(engine.generate(prompt(engine), SamplingParams(max_tokens=4, seed=1)))
    assert res.token_versions is None and res.versions == [0] * len(res.token_ids)
    on = make_vllm_engine()
    assert on.generator.records_token_versions
    res = asyncio.run(on.generate(prompt(on), SamplingParams(max_tokens=4, seed=1)))
    assert res.token_versions == [0] * len(res.token_ids)


def test_closing_the_gate_holds_a_request_started_in_the_same_loop_turn(make_vllm_engine):
    """The gate closes at once on the loop that closes it: a request that this loop runs next must wait."""
    engine = make_vllm_engine()

    async def go():
        assert engine.generator.gate.event().is_set()
        engine.generator.gate.set(False)
        closed_now = not engine.generator.gate.event().is_set()
        engine.generator.gate.set(True)
        return closed_now, engine.generator.gate.event().is_set()

    assert asyncio.run(go()) == (True, True)


def test_sync_timeout_stops_training_with_a_clear_error(make_vllm_engine):
    engine = make_vllm_engine(sync_timeout_s=0.5)
    fault(engine, pause_delay_s=5.0)

    async def go():
        batch = await rollout_batch(engine)
        out = await engine.train_step(batch)  # the learner's step is committed and reported (trained once)
        assert out["weight_sync_halted"] == 1.0 and "did not finish within" in engine.halted_reason
        with pytest.raises(TrainingHaltedError, match="did not finish within"):  # and it stays stopped
            await engine.train_step(batch)
        with pytest.raises(EngineUnavailableError, match="generation is stopped"):
            await engine.generate(prompt(engine), SamplingParams(max_tokens=2))

    asyncio.run(go())
    assert engine.generator.policy_version == 0 and engine.policy_version == 1
    assert calls(engine)[-1]["route"] == "resume"  # vLLM was not left paused


def test_probe_catches_weights_that_did_not_load(make_vllm_engine):
    engine = make_vllm_engine(lr=5e-2)
    fault(engine, ignore_reload=True)  # vLLM keeps serving the old weights

    async def go():
        batch = await rollout_batch(engine, 4)
        await engine.train_step(batch)
        with pytest.raises(TrainingHaltedError, match="disagree on the probe"):
            await engine.train_step(batch)

    asyncio.run(go())
    assert engine.generator.policy_version == 0
    assert engine.generator.stats["probe_logprob_diff"] > 0.01
    assert "probe_threshold" in (engine.generator.halted_reason or "")


def test_lora_sync_uses_versioned_adapters(make_vllm_engine):
    engine = make_vllm_engine(lora=LoraSettings(rank=4, alpha=8), lr=1e-2)

    async def go():
        await engine.train_step(await rollout_batch(engine))
        assert engine.generator.served.current() == "policy-v1"
        batch = await rollout_batch(engine)
        fault(engine, token_delay_s=0.05)  # ~3 s for the slow request: in flight across the next sync
        slow = asyncio.create_task(engine.generate(prompt(engine), SamplingParams(max_tokens=60, seed=1)))
        while "policy-v1" not in engine.generator.served.inflight:
            await asyncio.sleep(0.01)
        await engine.train_step(batch)
        loaded = [c for c in calls(engine) if c["route"].endswith("lora_adapter")]
        assert [(c["route"], c["lora_name"]) for c in loaded] == [
            ("load_lora_adapter", "policy-v1"), ("load_lora_adapter", "policy-v2")]  # v1 still in use
        res = await slow
        for _ in range(100):
            if any(c["route"] == "unload_lora_adapter" for c in calls(engine)):
                break
            await asyncio.sleep(0.02)
        return res

    res = asyncio.run(go())
    assert res.policy_version == 1
    assert engine.policy_version == 2
    unloads = [c["lora_name"] for c in calls(engine) if c["route"] == "unload_lora_adapter"]
    assert unloads == ["policy-v1"]  # unloaded once its last request finished
    assert not any(c["route"] == "collective_rpc" for c in calls(engine))  # LoRA never reloads the base


def test_crash_mid_request_gives_a_clear_error_and_vllm_restarts(make_vllm_engine):
    engine = make_vllm_engine()
    fault(engine, token_delay_s=0.05)
    first_pid = engine.generator.process.pid

    async def go():
        got_token = asyncio.Event()
        req = asyncio.create_task(engine.generate(prompt(engine), SamplingParams(max_tokens=200, seed=1),
                                                  on_token=lambda t, lp: got_token.set()))
        await got_token.wait()
        os.kill(first_pid, signal.SIGKILL)
        with pytest.raises(EngineUnavailableError, match="crashed during the request"):
            await req

    asyncio.run(go())
    for _ in range(200):  # the supervisor notices within watch_interval_s
        if engine.generator.process.counters.crashes:
            break
        time.sleep(0.05)
    assert engine.generator.process.wait_ready(60)
    assert engine.generator.process.pid != first_pid and engine.generator.process.counters.restarts == 1
    res = asyncio.run(engine.generate(prompt(engine), SamplingParams(max_tokens=3, seed=1)))
    assert len(res.token_ids) == 3


def test_requests_during_a_restart_fail_fast(make_vllm_engine):
    engine = make_vllm_engine(restart_backoff_s=30)  # the restart waits; requests must not
    os.kill(engine.generator.process.pid, signal.SIGKILL)
    for _ in range(100):
        if engine.generator.process.state is ProcessState.RESTARTING:
            break
        time.sleep(0.05)
    with pytest.raises(EngineUnavailableError, match="restarting") as err:
        asyncio.run(engine.generate(prompt(engine), SamplingParams(max_tokens=2)))
    assert err.value.retry_after_s


def test_load_brings_vllm_to_the_checkpoint(make_vllm_engine, tmp_path):
    engine = make_vllm_engine()

    async def go():
        await engine.train_step(await rollout_batch(engine))

    asyncio.run(go())
    engine.save(tmp_path / "ckpt")
    other = make_vllm_engine()
    other.load(tmp_path / "ckpt")  # the learner loads it; the seam reloads vLLM and probes
    assert other.policy_version == 1 and other.generator.policy_version == 1
    probe = asyncio.run(other.generator.swaps.probe(other.learner.score))
    assert probe.diff < 1e-3  # vLLM serves the checkpoint's weights


def begin(url: str) -> str:
    r = httpx.post(f"{url}/swarm/v1/episodes", json={"client_id": "c", "task_id": "t"})
    r.raise_for_status()
    return r.json()["api_key"]


def test_fake_vllm_crash_mid_request_through_the_server(make_server, make_vllm_engine):
    engine = make_vllm_engine()
    srv = make_server(engine)
    httpx.post(f"{engine.generator.url}/fault", json={"token_delay_s": 0.05}).raise_for_status()
    headers = {"Authorization": f"Bearer {begin(srv.url)}"}
    pid = engine.generator.process.pid
    threading.Timer(1.0, lambda: os.kill(pid, signal.SIGKILL)).start()
    r = httpx.post(f"{srv.url}/v1/chat/completions", headers=headers, timeout=60,
                   json={"model": "tiny", "messages": [{"role": "user", "content": "what is 2 + 2?"}], "max_tokens": 200})
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable", r.text
    assert httpx.get(f"{srv.url}/health").status_code == 200
    wait_until(lambda: engine.generator.process.counters.restarts == 1, timeout=60)
    assert engine.generator.process.wait_ready(60)
    r = httpx.post(f"{srv.url}/v1/chat/completions", headers=headers, timeout=60,
                   json={"model": "tiny", "messages": [{"role": "user", "content": "what is 2 + 2?"}], "max_tokens": 3})
    assert r.status_code == 200, r.text
