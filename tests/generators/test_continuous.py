"""Continuous batching (slot refill on the slot KV cache): exact logprobs whatever the join time, compaction
and growth of the cache, slot refill, train steps between decode steps, cancellation and shutdown.

The tests of what a caller sees run on both layouts (``layout``): the engine on a thread of this process, and the
engine in a process of its own (``generator.engine_process``), where the learner keeps its own copy of the weights
and pushes them after each step. The tests that reach into the scheduler or the runner run in process."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import torch

from agentjet.engines.base import GenerationResult, SamplingParams, TrainSample
from agentjet.engines.errors import EngineUnavailableError
from agentjet.generators.hf import slot_cache_fits
from agentjet.generators.hf.kv_cache import SlotKVCache
from agentjet.layouts.composed import ComposedEngine
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import GeneratorSettings

QUESTIONS = ["a", "what is 12 + 30?", "write the word hello in capital letters", "sort 3 1 2", "yes",
             "tool call please find the city weather", "tell me a long story about a cat and a dog", "hi there"]


LAYOUTS = ["in-process", "engine-process"]


def teacher_forced(engine: ComposedEngine, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    """The learner's logprobs of ``completion`` (its module is the generator's in process; in the engine-process
    layout it is the copy the engine's weights were pushed from)."""
    policy = engine.learner.policy
    ids = torch.tensor([prompt + completion], device=policy.device)
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0].float()
    logp = (logits / temperature).log_softmax(-1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


def max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def staggered(engine: ComposedEngine, prompts: list[list[int]], params: list[SamplingParams],
              gaps_s: list[float] | None = None) -> list[GenerationResult]:
    """Submit the requests (optionally a little apart, so they join running batches) and gather them."""
    async def main() -> list[GenerationResult]:
        tasks = []
        for i, (p, s) in enumerate(zip(prompts, params, strict=True)):
            tasks.append(asyncio.ensure_future(engine.generate(p, s)))
            if gaps_s:
                await asyncio.sleep(gaps_s[i % len(gaps_s)])
        return await asyncio.wait_for(asyncio.gather(*tasks), 120)

    return asyncio.run(main())


@pytest.mark.parametrize(("capacity", "layout"), [(16, "in-process"), (48, "in-process"), (512, "in-process"),
                                                  (16, "engine-process")])
def test_rows_joining_at_any_step_match_teacher_forcing(make_engine, chat_ids, capacity: int, layout: str) -> None:
    """Requests of different lengths join running batches at different steps (slot refill); with a small
    cache they are also compacted to its front and make it grow while other rows are generating."""
    engine = make_engine(layout, kv_cache_tokens=capacity)
    prompts = [chat_ids(q, engine) for q in QUESTIONS]
    params = [SamplingParams(temperature=[1.0, 0.7][i % 2], max_tokens=3 + 7 * i, seed=i) for i in range(len(prompts))]
    results = staggered(engine, prompts, params, gaps_s=[0.0, 0.01, 0.03])
    for p, s, r in zip(prompts, params, results, strict=True):
        assert len(r.token_ids) == s.max_tokens
        assert max_diff(r.logprobs, teacher_forced(engine, p, r.token_ids, s.temperature)) < 1e-4
    assert engine.generator.stats["decode_steps"] < sum(s.max_tokens for s in params)  # rows really shared steps
    if capacity == 16:
        assert engine.generator.stats["cache_grows"] >= 1 and engine.generator.describe()["kv_cache_tokens"] >= max(
            len(p) + s.max_tokens for p, s in zip(prompts, params, strict=True))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_same_tokens_as_the_static_engine(make_engine, chat_ids, layout: str) -> None:
    static, continuous = make_engine(batching="static"), make_engine(layout)
    prompts = [chat_ids(q, static) for q in QUESTIONS[:6]]
    params = [SamplingParams(temperature=1.0, max_tokens=5 + 3 * i, seed=40 + i, top_logprobs=2)
              for i in range(len(prompts))]
    a, b = staggered(static, prompts, params), staggered(continuous, prompts, params)
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert max_diff(x.logprobs, y.logprobs) < 1e-4
        assert x.top_logprobs is not None and y.top_logprobs is not None
        assert [[t for t, _ in alts] for alts in x.top_logprobs] == [[t for t, _ in alts] for alts in y.top_logprobs]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_finished_request_frees_its_slot_at_once(make_engine, chat_ids, layout: str) -> None:
    """Two slots, one short and two long requests: the second long one joins as soon as the short one ends,
    so the run takes about one long request's steps (a static batch would take two)."""
    engine = make_engine(layout, max_batch_size=2)
    ids = chat_ids("hello", engine)
    params = [SamplingParams(max_tokens=2, seed=1), SamplingParams(max_tokens=30, seed=2),
              SamplingParams(max_tokens=30, seed=3)]
    results = staggered(engine, [ids] * 3, params)
    assert [len(r.token_ids) for r in results] == [2, 30, 30]
    assert engine.generator.stats["decode_steps"] <= 33


@pytest.mark.parametrize("layout", LAYOUTS)
def test_generate_train_generate_matches_a_fresh_engine(make_engine, chat_ids, tmp_path: Path, layout: str) -> None:
    """A train step updates the weights in place: what the engine generates next is exactly what a fresh
    engine holding the trained weights generates (nothing in the decode path kept a stale copy). In the
    engine-process layout the step's weights reach the engine by the push, and a checkpoint's by the load's."""
    engine = make_engine(layout)
    engine.set_learning_rate(1e-2)
    ids = chat_ids("what is 4 + 4?", engine)
    first = staggered(engine, [ids, ids], [SamplingParams(max_tokens=12, seed=s) for s in (1, 2)])
    batch = [TrainSample(ids + r.token_ids, [0] * len(ids) + [1] * len(r.token_ids),
                         [0.0] * len(ids) + r.logprobs, [0.0] * len(ids) + [adv] * len(r.token_ids))
             for r, adv in zip(first, (1.0, -1.0), strict=True)]
    asyncio.run(engine.train_step(batch))
    params = [SamplingParams(max_tokens=12, seed=s) for s in (5, 6, 7)]
    after = staggered(engine, [ids] * 3, params)
    engine.save(tmp_path / "ckpt")
    fresh = make_engine(layout)
    fresh.load(tmp_path / "ckpt")
    again = staggered(fresh, [ids] * 3, params)
    for x, y in zip(after, again, strict=True):
        assert x.token_ids == y.token_ids and x.policy_version == y.policy_version == 1
        assert max_diff(x.logprobs, y.logprobs) < 1e-5
    before = staggered(make_engine(), [ids] * 3, params)  # the untrained weights give other logprobs
    assert max(max_diff(x.logprobs, y.logprobs) for x, y in zip(before, after, strict=True)) > 1e-3


def held_step(engine: ComposedEngine, monkeypatch) -> tuple[threading.Event, threading.Event]:
    """The learner's step body held until ``release`` is set (``entered``: it has begun)."""
    entered, release = threading.Event(), threading.Event()
    real = engine.learner._train

    def slow_step(batch):
        entered.set()
        assert release.wait(30)
        return real(batch)

    monkeypatch.setattr(engine.learner, "_train", slow_step)
    return entered, release


def test_a_request_arriving_during_a_train_step_waits_and_gets_the_new_weights(make_engine, chat_ids,
                                                                             monkeypatch) -> None:
    engine = make_engine()
    ids = chat_ids("hi", engine)
    entered, release = held_step(engine, monkeypatch)  # the step body, run on the shared worker thread
    sample = TrainSample(ids + [5, 6], [0] * len(ids) + [1, 1], [0.0] * len(ids) + [-3.0, -3.0],
                         [0.0] * len(ids) + [1.0, 1.0])

    async def main() -> tuple[dict, GenerationResult]:
        train = asyncio.ensure_future(engine.train_step([sample]))
        await asyncio.to_thread(entered.wait, 30)
        gen = asyncio.ensure_future(engine.generate(ids, SamplingParams(max_tokens=4, seed=1)))
        await asyncio.sleep(0.2)
        assert not gen.done()  # it waits for the train step
        release.set()
        return await asyncio.wait_for(train, 60), await asyncio.wait_for(gen, 60)

    metrics, res = asyncio.run(main())
    assert metrics["policy_version"] == 1.0 and res.policy_version == 1
    assert max_diff(res.logprobs, teacher_forced(engine, ids, res.token_ids, 1.0)) < 1e-4


def test_in_the_engine_process_a_request_during_a_train_step_is_served_at_once(make_engine, chat_ids,
                                                                              monkeypatch) -> None:
    """The engine process does not wait for the learner (it holds its own copy of the weights): a request that
    arrives during a train step is generated at once by the weights it holds (v0); once the step's push has
    landed, a new request gets v1 and exactly the learner's new weights."""
    engine = make_engine("engine-process")
    engine.set_learning_rate(1e-2)
    ids = chat_ids("hi", engine)
    entered, release = held_step(engine, monkeypatch)
    sample = TrainSample(ids + [5, 6], [0] * len(ids) + [1, 1], [0.0] * len(ids) + [-3.0, -3.0],
                         [0.0] * len(ids) + [1.0, 1.0])

    async def main() -> tuple[GenerationResult, dict, GenerationResult]:
        train = asyncio.ensure_future(engine.train_step([sample]))
        await asyncio.to_thread(entered.wait, 30)
        during = await asyncio.wait_for(engine.generate(ids, SamplingParams(max_tokens=6, seed=1)), 60)
        assert not train.done()  # served while the step still runs
        release.set()
        metrics = await asyncio.wait_for(train, 60)
        after = await asyncio.wait_for(engine.generate(ids, SamplingParams(max_tokens=6, seed=1)), 60)
        return during, metrics, after

    during, metrics, after = asyncio.run(main())
    assert during.policy_version == 0 and set(during.versions) == {0}
    assert metrics["policy_version"] == 1.0 and metrics["rollout_policy_version"] == 1.0
    assert after.policy_version == 1 and set(after.versions) == {1} and engine.generator_version == 1
    assert max_diff(after.logprobs, teacher_forced(engine, ids, after.token_ids, 1.0)) < 1e-4
    assert max_diff(during.logprobs, teacher_forced(engine, ids, during.token_ids, 1.0)) > 1e-3  # the old weights


@pytest.mark.parametrize(("layout", "max_tokens"), [("in-process", 40), ("engine-process", 1000)])
def test_rows_in_flight_go_on_across_a_train_step(make_engine, chat_ids, layout: str, max_tokens: int) -> None:
    """A train step submitted while a request generates runs between two of its decode steps; the request
    finishes (with the version it started under) and its later tokens come from the new weights. (The engine
    process goes on decoding during the step and the push: its request is longer, to outlast them.)"""
    engine = make_engine(layout)
    engine.set_learning_rate(1e-2)
    ids = chat_ids("hi", engine)
    sample = TrainSample(ids + [5, 6], [0] * len(ids) + [1, 1], [0.0] * len(ids) + [-3.0, -3.0],
                         [0.0] * len(ids) + [1.0, 1.0])
    seen: list[int] = []

    async def main() -> tuple[GenerationResult, int]:
        started = asyncio.Event()

        def on_token(_t: int, _lp: float) -> None:
            seen.append(engine.policy_version)
            if len(seen) == 3:
                started.set()

        gen = asyncio.ensure_future(engine.generate(ids, SamplingParams(max_tokens=max_tokens, seed=1),
                                                    on_token=on_token))
        await started.wait()
        await engine.train_step([sample])
        tokens_when_trained = len(seen)
        return await asyncio.wait_for(gen, 60), tokens_when_trained

    res, at = asyncio.run(main())
    assert len(res.token_ids) == max_tokens and res.policy_version == 0
    assert 3 <= at < max_tokens  # the step ran while the request was generating
    assert set(res.versions) == {0, 1} and res.versions == sorted(res.versions)  # v0 tokens, then v1 tokens
    assert engine.policy_version == 1


def test_a_reply_that_spans_a_train_step_records_the_version_of_each_token(make_engine, chat_ids,
                                                                          monkeypatch) -> None:
    """A train step that runs between two decode steps (as the in-process learner's job does) moves the version
    of every later token of a reply in flight: the reply carries both versions, changing at the right token."""
    engine = make_engine()
    engine.set_learning_rate(1e-2)
    ids = chat_ids("hi", engine)
    sample = TrainSample(ids + [5, 6], [0] * len(ids) + [1, 1], [0.0] * len(ids) + [-3.0, -3.0],
                         [0.0] * len(ids) + [1.0, 1.0])
    scheduler = engine.generator.core.scheduler
    real_step, steps = scheduler.step, []

    def step() -> None:  # on the worker thread: one unit of work, then (once) the learner's step job
        real_step()
        steps.append(len(scheduler.active[0].ids) if scheduler.active else None)
        if len(steps) == 2:
            engine.learner._train([sample])

    monkeypatch.setattr(scheduler, "step", step)
    res = asyncio.run(engine.generate(ids, SamplingParams(max_tokens=8, seed=1)))
    at = steps[1]  # tokens generated before the step: the prefill's and one per decode step
    assert at == 3 and len(res.token_ids) == 8
    assert res.token_versions == [0] * at + [1] * (8 - at)
    assert res.policy_version == 0 and engine.generator.policy_version == 1


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_cancelled_request_frees_its_slot(make_engine, chat_ids, layout: str) -> None:
    engine = make_engine(layout, max_batch_size=1)
    ids = chat_ids("hello", engine)

    async def main() -> GenerationResult:
        long = asyncio.ensure_future(engine.generate(ids, SamplingParams(max_tokens=10_000, seed=1)))
        await asyncio.sleep(0.3)
        long.cancel()
        return await asyncio.wait_for(engine.generate(ids, SamplingParams(max_tokens=3, seed=2)), 30)

    assert len(asyncio.run(main()).token_ids) == 3


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shutdown_fails_waiting_requests_and_never_hangs(make_engine, chat_ids, layout: str) -> None:
    engine = make_engine(layout, max_batch_size=1)
    ids = chat_ids("hello", engine)

    async def main() -> list:
        reqs = [asyncio.ensure_future(engine.generate(ids, SamplingParams(max_tokens=10_000, seed=s)))
                for s in range(3)]
        await asyncio.sleep(0.2)
        await engine.close()
        return await asyncio.wait_for(asyncio.gather(*reqs, return_exceptions=True), 30)

    assert all(isinstance(r, EngineUnavailableError) for r in asyncio.run(main()))
    with pytest.raises(EngineUnavailableError):
        asyncio.run(engine.generate(ids, SamplingParams(max_tokens=3)))


def test_cache_moves_columns_in_place() -> None:
    """compact / shift_right move the columns in use without reallocating; grow keeps them."""
    from transformers import LlamaConfig

    config = LlamaConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=8)
    cache = SlotKVCache(config, slots=2, capacity=16, dtype=torch.float32, device=torch.device("cpu"))
    cols = torch.arange(16, dtype=torch.float32)
    for layer in cache.layers:
        layer.keys[..., 0] = cols
        layer.values[..., 0] = -cols
    ptr = cache.layers[0].keys.data_ptr()
    cache.compact(5, 12)  # [5, 12) -> [0, 7)
    assert torch.equal(cache.layers[1].keys[1, 0, :7, 0], cols[5:12])
    assert torch.equal(cache.layers[1].values[0, 0, :7, 0], -cols[5:12])
    cache.shift_right(3, 7)  # [0, 7) -> [3, 10)
    assert torch.equal(cache.layers[0].keys[0, 0, 3:10, 0], cols[5:12])
    assert cache.layers[0].keys.data_ptr() == ptr  # in place: CUDA graphs stay valid
    cache.grow(64, 10)
    assert cache.capacity == 64 and cache.layers[0].keys.shape[2] == 64
    assert torch.equal(cache.layers[0].keys[1, 0, 3:10, 0], cols[5:12])


def test_compaction_keeps_long_runs_exact(make_engine, chat_ids) -> None:
    """Many more steps than the cache has columns: rows keep being compacted to the front, exactly."""
    engine = make_engine(kv_cache_tokens=64, max_batch_size=3)
    prompts = [chat_ids(q, engine) for q in QUESTIONS[:6]]
    params = [SamplingParams(max_tokens=[40, 10, 25][i % 3], seed=i) for i in range(len(prompts))]
    results = staggered(engine, prompts, params, gaps_s=[0.0, 0.02])
    for p, r in zip(prompts, results, strict=True):
        assert max_diff(r.logprobs, teacher_forced(engine, p, r.token_ids, 1.0)) < 1e-4
    assert engine.generator.stats["compactions"] >= 1 and engine.generator.core.runner.capacity == 64


def test_models_with_sliding_windows_fall_back_to_static_batching() -> None:
    from transformers import LlamaConfig, MistralConfig

    assert slot_cache_fits(LlamaConfig()) is None
    assert "sliding" in (slot_cache_fits(MistralConfig(sliding_window=64)) or "")


def test_the_batching_path_is_chosen_once_when_the_generator_is_built(tiny_model_path: Path, caplog) -> None:
    """``hf_generator`` reads ``generator.batching`` once: a class per path, and a model the slot cache cannot serve
    (here the tiny model given a sliding window) falls back to static batching, except with named adapters."""
    from agentjet.engines.model import load_policy_model
    from agentjet.generators.hf import ContinuousHFGenerator, StaticHFGenerator, hf_generator
    from agentjet.settings import LearnerSettings, LoraSettings

    policy = load_policy_model(tiny_model_path)
    made = [hf_generator(policy), hf_generator(policy, GeneratorSettings(batching="static"))]
    assert [type(g) for g in made] == [ContinuousHFGenerator, StaticHFGenerator]
    assert [g.describe()["batching"] for g in made] == ["continuous", "static"]
    policy.causal_lm.config.sliding_window = 64
    fallback = hf_generator(policy)
    made.append(fallback)
    assert type(fallback) is StaticHFGenerator and "does not support sliding window 64" in caplog.text
    with pytest.raises(ValueError, match="cannot serve a model with sliding window 64"):
        ContinuousHFGenerator(policy)
    for g in made:
        run_blocking(g.close())
    pytest.importorskip("peft")
    lora = LearnerSettings(lora=LoraSettings(rank=2))
    named = load_policy_model(tiny_model_path, learner=lora, adapters=["planner"])
    with pytest.raises(ValueError, match=r"\['planner'\] need continuous batching, but generator.batching is "
                                         "'static'"):
        hf_generator(named, GeneratorSettings(batching="static"))
    named.causal_lm.config.sliding_window = 64
    with pytest.raises(ValueError, match=r"need continuous batching, but the model has sliding window 64"):
        hf_generator(named)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_status_reports_the_engine(make_engine, layout: str) -> None:
    info = make_engine(layout, kv_cache_tokens=64).describe()
    assert info["batching"] == "continuous" and info["kv_cache_tokens"] == 64 and info["cuda_graphs"] is False
    assert info["device"] == "cpu" and info["dtype"] == "float32"
    assert ("engine_process" in info) == (layout == "engine-process")


class _FakeGraph:
    """Stands in for a captured CUDA graph on CPU: replay writes the eager forward's logits into the static buffer
    (plus ``error``, to check that a graph that disagrees with the eager forward is dropped)."""

    def __init__(self, step, error: float) -> None:
        self.step, self.error = step, error
        self.logits = step().clone()

    def replay(self) -> None:
        self.logits.copy_(self.step() + self.error)


@pytest.mark.parametrize("mode", ["good", "wrong", "capture-fails"])
def test_graph_buckets_replay_verify_and_fall_back(make_engine, chat_ids, monkeypatch, mode: str) -> None:
    """The CUDA-graph control flow, on CPU: rows and the attention window are rounded up to buckets (the
    columns past t are masked), each (rows, window) bucket of a decode step or of a prefill is captured once,
    checked against the eager forward on its first replay, and dropped for it when it disagrees or cannot be
    captured. Exact in every case."""
    from agentjet.generators.hf.graphs import Graph

    engine, reference = make_engine(max_batch_size=8), make_engine(max_batch_size=8)
    runner = engine.generator.core.runner
    runner.use_graphs = runner.bucketed = runner.static_prefill = True

    def capture(step) -> Graph:
        if mode == "capture-fails":
            raise RuntimeError("operation not permitted when stream is capturing")
        g = _FakeGraph(step, 0.0 if mode == "good" else 0.5)
        runner.stats["graph_captures"] += 1
        return Graph(g, g.logits)

    monkeypatch.setattr(runner.graphs, "capture", capture)
    prompts = [chat_ids(q, engine) for q in QUESTIONS[:6]]
    params = [SamplingParams(max_tokens=4 + 6 * i, seed=i) for i in range(len(prompts))]
    got, want = staggered(engine, prompts, params, gaps_s=[0.0, 0.02]), staggered(reference, prompts, params)
    for p, x, y in zip(prompts, got, want, strict=True):
        assert x.token_ids == y.token_ids
        assert max_diff(x.logprobs, teacher_forced(engine, p, x.token_ids, 1.0)) < 1e-4
    stats = engine.generator.stats
    assert stats["static_prefills"] >= 1
    if mode == "good":
        assert stats["graph_replays"] > stats["graph_captures"] > 0 and stats["graph_failures"] == 0
        assert {kind for kind, _, _ in runner.graphs.graphs} == {"decode", "prefill"}
    else:
        assert stats["graph_failures"] >= 1 and {kind for kind, _, _ in runner.graphs.eager} == {"decode", "prefill"}


def test_a_static_prefill_pads_rows_and_width_and_stays_exact(make_engine, chat_ids) -> None:
    """Prefills padded to (rows, width) buckets from device buffers, as CUDA graphs capture them, run eagerly on
    CPU: joiners of any count and length, alone or joining running rows, give the tokens of the plain prefill and
    teacher-forced logprobs; the pad rows write only the scratch slot, which no decode step reads."""
    engine, reference = make_engine(max_batch_size=8), make_engine(max_batch_size=8)
    runner = engine.generator.core.runner
    runner.static_prefill = True
    prompts = [chat_ids(q, engine) for q in QUESTIONS]  # 8 prompts: blocks of 1, 3, 5... rows (pad rows)
    params = [SamplingParams(temperature=[1.0, 0.7][i % 2], max_tokens=3 + 5 * i, seed=i) for i in range(len(prompts))]
    got = staggered(engine, prompts, params, gaps_s=[0.0, 0.0, 0.015])
    want = staggered(reference, prompts, params, gaps_s=[0.0, 0.0, 0.015])
    for p, s, x, y in zip(prompts, params, got, want, strict=True):
        assert x.token_ids == y.token_ids
        assert max_diff(x.logprobs, teacher_forced(engine, p, x.token_ids, s.temperature)) < 1e-4
    assert engine.generator.stats["static_prefills"] >= 2
    assert reference.generator.stats["static_prefills"] == 0

    # three rows into slots 0-2 of an idle engine: a bucket of 4 rows (one pad row) and 64 columns; the other
    # slots' columns are untouched (the pad row wrote into the scratch slot)
    def prefill(r) -> tuple[torch.Tensor, torch.Tensor]:
        others = torch.stack([layer.keys[3 : r.slots].clone() for layer in r.cache.slot_layers])
        logits = r.prefill([0, 1, 2], prompts[:3]).clone()
        after = torch.stack([layer.keys[3 : r.slots] for layer in r.cache.slot_layers])
        return logits, (after - others).abs().max()

    before = engine.generator.stats["static_prefills"]
    static, moved = engine.generator.worker.submit(prefill, runner).result()
    plain, _ = reference.generator.worker.submit(prefill, reference.generator.core.runner).result()
    assert engine.generator.stats["static_prefills"] == before + 1
    assert static.shape == plain.shape == (3, plain.shape[1])
    assert float((static - plain).abs().max()) < 1e-4 and float(moved) == 0.0


def test_compile_matches_eager_on_cpu(make_engine, chat_ids) -> None:
    """``compile=True``: the decode step through torch.compile (CPU inductor) gives the eager step's tokens."""
    plain, compiled = make_engine(), make_engine(compile=True)
    prompts = [chat_ids(q, plain) for q in QUESTIONS[:4]]
    params = [SamplingParams(max_tokens=6 + 4 * i, seed=i) for i in range(len(prompts))]
    for x, y in zip(staggered(plain, prompts, params), staggered(compiled, prompts, params), strict=True):
        assert x.token_ids == y.token_ids
        assert max_diff(x.logprobs, y.logprobs) < 1e-4


def test_an_unpadded_prefill_leaves_the_mask_to_sdpas_causal_kernel(make_engine, chat_ids) -> None:
    """A block with no padding (one prompt, or prompts of one length) passes no mask, so transformers leaves it out
    and SDPA runs causally; a padded block passes its 4D mask. Both give the model's logprobs."""
    engine = make_engine()
    runner = engine.generator.core.runner
    masks: list[object] = []
    hook = runner.model.register_forward_pre_hook(
        lambda _m, _a, kw: masks.append(kw.get("attention_mask")), with_kwargs=True)
    try:
        one, short = chat_ids("what is 12 + 30?", engine), chat_ids("a", engine)
        params = [SamplingParams(temperature=1.0, max_tokens=4, seed=s) for s in (1, 2)]
        alone = staggered(engine, [one], params[:1])
        prefill_masks = [masks[0]]
        masks.clear()
        padded = staggered(engine, [one, short], params)  # one burst: a block of two lengths
        prefill_masks.append(masks[0])
    finally:
        hook.remove()
    assert prefill_masks[0] is None
    assert isinstance(prefill_masks[1], torch.Tensor) and prefill_masks[1].dim() == 4
    for p, r in ((one, alone[0]), (one, padded[0]), (short, padded[1])):
        assert max_diff(r.logprobs, teacher_forced(engine, p, r.token_ids, 1.0)) < 1e-4
