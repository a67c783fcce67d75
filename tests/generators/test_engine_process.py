"""The embedded generator in an engine process of its own (``generators/hf/engine_process``): the wire, the choice
of layout, and what the process boundary must never do: let a bad request harm its neighbours, hang a caller when
the engine dies or stops answering, or outlive the server that started it. (What a caller sees of continuous
batching, versions and weight pushes through the process: tests/generators/test_continuous.py, ``layout=engine-process``.)"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentjet.engines.base import FinishReason, GenerationResult, SamplingParams
from agentjet.engines.errors import EngineUnavailableError, GenerationError
from agentjet.generators.hf.engine_process import wire
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import GeneratorSettings, ServerConfig


# ---------------------------------------------------------------------- the wire (no process)
def test_the_wire_carries_sampling_results_and_errors_exactly() -> None:
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, max_tokens=33, stop=("\n\n", "END"),
                            stop_token_ids=(2, 7), seed=2**62 + 3, top_logprobs=3)
    assert wire.decode_sampling(wire.encode_sampling(params)) == params
    assert len(wire.encode_sampling(params)) == len(SamplingParams.__dataclass_fields__)  # every field travels
    result = GenerationResult(token_ids=[5, 6, 7], logprobs=[-0.1234567890123, -2.5, -1e-9], finish_reason=FinishReason.STOP,
                              policy_version=3, text="héllo", top_logprobs=[[(5, -0.1), (9, -3.0)]] * 3,
                              token_versions=[3, 3, 4])
    frame = wire.pack([[wire.Kind.DONE, 1, wire.encode_result(result)]])
    unpacker = wire.unpacker()
    got = []
    for i in range(len(frame)):  # a frame split at every byte still decodes once, whole
        unpacker.feed(frame[i:i + 1])
        got.extend(unpacker)
    assert len(got) == 1 and wire.decode_result(got[0][0][2]) == result
    refused = wire.decode_error(wire.encode_error(GenerationError("top_k must be at most 1024", param="top_k")))
    assert isinstance(refused, GenerationError) and refused.param == "top_k" and "1024" in str(refused)
    broken = wire.decode_error(wire.encode_error(RuntimeError("CUDA error: device-side assert")))
    assert isinstance(broken, EngineUnavailableError) and "RuntimeError: CUDA error" in str(broken)


# ---------------------------------------------------------------------- the choice of layout
def test_the_layout_is_chosen_by_the_setting_and_refused_where_the_engine_runs_in_process() -> None:
    import torch
    from transformers import LlamaConfig, MistralConfig

    from agentjet.generators.hf.build import ENGINE_PROCESS_BY_DEVICE, engine_process_wanted

    llama, sliding = LlamaConfig(), MistralConfig(sliding_window=64)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")

    def wanted(device, config=llama, **settings) -> bool:
        return engine_process_wanted(GeneratorSettings(**settings), device, config)

    assert wanted(cpu, engine_process="on") and wanted(cuda, engine_process="on")
    assert not wanted(cpu, engine_process="off") and not wanted(cuda, engine_process="off")
    assert wanted(cpu) is ENGINE_PROCESS_BY_DEVICE["cpu"] and wanted(cuda) is ENGINE_PROCESS_BY_DEVICE["cuda"]
    assert not wanted(cuda, batching="static") and not wanted(cuda, sliding)  # auto keeps static batching in process
    with pytest.raises(ValueError, match="generator.batching is 'static'"):
        wanted(cpu, engine_process="on", batching="static")
    with pytest.raises(ValueError, match="sliding window 64"):
        wanted(cpu, sliding, engine_process="on")
    on = {"engine_process": "on"}
    with pytest.raises(ValueError, match="generator.kind is vllm"):
        ServerConfig.model_validate({"generator": {**on, "kind": "vllm"}})
    with pytest.raises(ValueError, match="static batching runs in process"):
        ServerConfig.model_validate({"generator": {**on, "batching": "static"}})
    with pytest.raises(ValueError, match=r"LoRA adapters \['planner'\].*keep the in-process engine"):
        ServerConfig.model_validate({"generator": on, "learner": {"lora": {"rank": 4, "adapters": ["planner"]}}})
    auto = ServerConfig.model_validate({"learner": {"lora": {"rank": 4, "adapters": ["planner"]}}})
    assert auto.generator.engine_process == "auto"  # auto with adapters: their layout keeps the engine in process


# ---------------------------------------------------------------------- through a real engine process
def _engine(tiny_model_path: Path, **settings):
    from agentjet.engines.model import model_facts
    from agentjet.generators.hf.engine_process import ProcessHFGenerator

    gen = ProcessHFGenerator(model_facts(tiny_model_path), GeneratorSettings(**{"max_batch_size": 4, **settings}))
    gen.rules.stop_ids = frozenset()  # fixed lengths: every request runs to its max_tokens
    return gen.wait_ready()


def _prompt(gen, text: str) -> list[int]:
    return list(gen.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=False))


@pytest.mark.timeout(300)
def test_bad_input_fails_alone_and_a_dead_engine_fails_its_callers_at_once(tiny_model_path) -> None:
    """Requests with bad parameters fail alone, naming them (in the server, or in the engine process), while
    their neighbours in the same batch generate exactly what they generate alone. Then the engine process is
    killed mid-request: the caller gets an ``EngineUnavailableError`` within seconds, as does every later caller,
    at once."""
    gen = _engine(tiny_model_path)
    vocab = len(gen.tokenizer)
    ids = _prompt(gen, "hello there")
    good = [SamplingParams(max_tokens=12 + 3 * i, seed=i) for i in range(3)]

    async def batch() -> list:
        calls = [gen.generate(ids, p) for p in good] + [
            gen.generate(ids, SamplingParams(max_tokens=8, top_k=vocab + 1, seed=9)),  # refused by the engine
            gen.generate(ids, SamplingParams(max_tokens=8, stop_token_ids=(vocab + 5,))),  # refused by the engine
            gen.generate([vocab + 3, *ids], SamplingParams(max_tokens=8)),  # refused here: never crosses
        ]
        return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 120)

    async def alone() -> list[GenerationResult]:
        return [await asyncio.wait_for(gen.generate(ids, p), 60) for p in good]

    try:
        mixed, solo = asyncio.run(batch()), asyncio.run(alone())
        assert [type(r) for r in mixed[3:]] == [GenerationError] * 3
        assert [r.param for r in mixed[3:]] == ["top_k", "stop_token_ids", "messages"]
        for got, want, p in zip(mixed[:3], solo, good, strict=True):
            assert isinstance(got, GenerationResult) and len(got.token_ids) == p.max_tokens
            assert got.token_ids == want.token_ids  # the neighbours, untouched (a batch moves the float sums a little)
            assert max(abs(x - y) for x, y in zip(got.logprobs, want.logprobs, strict=True)) < 1e-4
        assert gen.counters()["generated_tokens"] >= 2 * sum(p.max_tokens for p in good)

        async def killed() -> tuple[BaseException, float, BaseException]:
            streamed = asyncio.Event()
            call = asyncio.ensure_future(gen.generate(ids, SamplingParams(max_tokens=3000, seed=1),
                                                      on_token=lambda _t, _lp: streamed.set()))
            await asyncio.wait_for(streamed.wait(), 60)
            assert gen.child is not None
            os.kill(gen.child.pid, signal.SIGKILL)
            t0 = time.monotonic()
            first = await asyncio.wait_for(asyncio.gather(call, return_exceptions=True), 30)
            waited = time.monotonic() - t0
            later = await asyncio.gather(gen.generate(ids, SamplingParams(max_tokens=2)), return_exceptions=True)
            return first[0], waited, later[0]

        first, waited, later = asyncio.run(killed())
        assert isinstance(first, EngineUnavailableError) and "exit code -9" in str(first)
        assert waited < 10 and isinstance(later, EngineUnavailableError) and not gen.alive
    finally:
        run_blocking(gen.close())


@pytest.mark.timeout(300)
def test_an_engine_that_stops_answering_is_given_up_within_its_heartbeat_bound(tiny_model_path) -> None:
    """SIGSTOP freezes the engine process (nothing closes, nothing is sent): past ``heartbeat_timeout_s`` of
    silence its callers fail with an ``EngineUnavailableError`` naming the bound, and the process is killed."""
    from agentjet.settings import EngineProcessSettings

    gen = _engine(tiny_model_path, process=EngineProcessSettings(heartbeat_timeout_s=3, stop_timeout_s=1))
    ids = _prompt(gen, "hello")
    assert gen.child is not None
    try:
        async def frozen() -> tuple[BaseException, float]:
            streamed = asyncio.Event()
            call = asyncio.ensure_future(gen.generate(ids, SamplingParams(max_tokens=3000, seed=1),
                                                      on_token=lambda _t, _lp: streamed.set()))
            await asyncio.wait_for(streamed.wait(), 60)
            os.kill(gen.child.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            [outcome] = await asyncio.wait_for(asyncio.gather(call, return_exceptions=True), 60)
            return outcome, time.monotonic() - t0

        outcome, waited = asyncio.run(frozen())
        assert isinstance(outcome, EngineUnavailableError) and "heartbeat_timeout_s" in str(outcome)
        assert 2 < waited < 3 + 5  # the bound, plus the reader's poll and a loaded machine's slack
        assert gen.child.wait(30) is not None  # stopped for good (SIGKILL reaches a stopped process)
    finally:
        run_blocking(gen.close())


CHILD_OWNER = """
import sys, time
from agentjet.engines.model import model_facts
from agentjet.generators.hf.engine_process import ProcessHFGenerator
gen = ProcessHFGenerator(model_facts(sys.argv[1])).wait_ready()
print(gen.child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(300)
def test_the_engine_process_dies_with_a_server_that_was_killed(tiny_model_path) -> None:
    """A server killed hard (SIGKILL: no close, no atexit) leaves no engine process behind: the parent-death
    signal (and the socket's end) takes it down."""
    owner = subprocess.Popen([sys.executable, "-c", CHILD_OWNER, str(tiny_model_path)], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert owner.stdout is not None
        engine_pid = int(owner.stdout.readline())
        os.kill(engine_pid, 0)  # it runs
        owner.kill()
        owner.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(engine_pid):
            time.sleep(0.1)
        assert not _alive(engine_pid)
    finally:
        owner.kill()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
