from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from agentjet.engines.base import FinishReason, SamplingParams, TrainSample
from agentjet.layouts import embedded_engine
from agentjet.layouts.composed import ComposedEngine
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import LoraSettings, LossSettings


def engine_of(model, *, device: str = "auto", dtype: str = "auto", lora=None, autocast_bf16: bool = False,
              loss=None, learning_rate: float = 1e-5, **generator):  # noqa: ANN001, ANN201
    """The single-process engine with these settings, each given to its section."""
    from agentjet.settings import GeneratorSettings, LearnerSettings, LoraSettings, PlacementSettings

    return embedded_engine(model, GeneratorSettings(**generator),
                           LearnerSettings(lora=lora or LoraSettings(), autocast_bf16=autocast_bf16,
                                           learning_rate=learning_rate),
                           loss, PlacementSettings(device=device, dtype=dtype))


def gen(engine: ComposedEngine, ids: list[int], **kw) -> object:
    return asyncio.run(engine.generate(ids, SamplingParams(**kw)))


def teacher_forced_logprobs(engine: ComposedEngine, prompt: list[int], completion: list[int], temperature: float):
    """Independent reference: one full forward pass, log_softmax(logits / T) at each generated token."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = engine.generator.model(input_ids=ids).logits[0].float()
    logp = (logits / temperature).log_softmax(-1)
    n = len(prompt)
    return [float(logp[n - 1 + i, t]) for i, t in enumerate(completion)]


def test_seed_reproducible_and_seeds_differ(tiny_engine: ComposedEngine, chat_ids) -> None:
    ids = chat_ids("what is 1 + 2?", tiny_engine)
    a = gen(tiny_engine, ids, temperature=1.0, max_tokens=24, seed=7)
    b = gen(tiny_engine, ids, temperature=1.0, max_tokens=24, seed=7)
    c = gen(tiny_engine, ids, temperature=1.0, max_tokens=24, seed=8)
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert a.token_ids != c.token_ids


def test_max_tokens_honoured(tiny_engine: ComposedEngine, chat_ids) -> None:
    ids = chat_ids("hello", tiny_engine)
    for n in (1, 5, 17):
        r = gen(tiny_engine, ids, temperature=1.0, max_tokens=n, seed=3, stop_token_ids=())
        assert len(r.token_ids) <= n
        if r.finish_reason is FinishReason.LENGTH:
            assert len(r.token_ids) == n


def test_stop_string_cuts_text_and_generation(tiny_engine: ComposedEngine, chat_ids) -> None:
    ids = chat_ids("write a word", tiny_engine)
    full = gen(tiny_engine, ids, temperature=1.0, max_tokens=40, seed=11)
    text = full.text
    assert len(text) > 12
    stop = text[8:11]
    cut = gen(tiny_engine, ids, temperature=1.0, max_tokens=40, seed=11, stop=(stop,))
    assert cut.finish_reason is FinishReason.STOP
    assert cut.text == text[: text.find(stop)]
    assert stop not in cut.text
    # the tokens are a strict prefix of the unconstrained run: generation really stopped there
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]
    assert len(cut.token_ids) < len(full.token_ids)


def test_stop_token_ids_honoured(tiny_engine: ComposedEngine, chat_ids) -> None:
    ids = chat_ids("count", tiny_engine)
    full = gen(tiny_engine, ids, temperature=1.0, max_tokens=30, seed=5)
    target = full.token_ids[6]
    r = gen(tiny_engine, ids, temperature=1.0, max_tokens=30, seed=5, stop_token_ids=(target,))
    first = full.token_ids.index(target)
    assert r.token_ids == full.token_ids[: first + 1]
    assert r.finish_reason is FinishReason.STOP


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_teacher_forcing(tiny_engine: ComposedEngine, chat_ids, temperature: float) -> None:
    ids = chat_ids("what is the weather in the city?", tiny_engine)
    r = gen(tiny_engine, ids, temperature=temperature, max_tokens=32, seed=1)
    ref = teacher_forced_logprobs(tiny_engine, ids, r.token_ids, temperature)
    assert len(r.logprobs) == len(r.token_ids) > 0
    assert max(abs(a - b) for a, b in zip(r.logprobs, ref, strict=True)) < 1e-4


def test_greedy_and_top_k_one_pick_the_argmax(tiny_engine: ComposedEngine, chat_ids) -> None:
    ids = chat_ids("sort these numbers", tiny_engine)
    greedy = gen(tiny_engine, ids, temperature=0.0, max_tokens=12)
    topk = gen(tiny_engine, ids, temperature=1.3, top_k=1, max_tokens=12, seed=99)
    assert greedy.token_ids == topk.token_ids
    seq = list(ids)
    for t in greedy.token_ids:
        with torch.no_grad():
            logits = tiny_engine.generator.model(input_ids=torch.tensor([seq])).logits[0, -1]
        assert int(logits.argmax()) == t
        seq.append(t)


def test_top_p_restricts_support(tiny_engine: ComposedEngine, chat_ids) -> None:
    ids = chat_ids("hello there", tiny_engine)
    top_p = 0.1
    r = gen(tiny_engine, ids, temperature=1.0, top_p=top_p, max_tokens=16, seed=4, top_logprobs=3)
    assert r.top_logprobs is not None and all(len(alts) == 3 for alts in r.top_logprobs)
    seq = list(ids)
    for chosen in r.token_ids:  # every drawn token lies inside the nucleus of the true distribution
        with torch.no_grad():
            probs = tiny_engine.generator.model(input_ids=torch.tensor([seq])).logits[0, -1].softmax(-1)
        order = probs.argsort(descending=True).tolist()
        mass_before = float(probs[order[: order.index(chosen)]].sum())
        assert mass_before < top_p
        seq.append(chosen)


def test_dynamic_batching_returns_each_caller_its_own_result(tiny_engine: ComposedEngine, chat_ids) -> None:
    prompts = [chat_ids(p, tiny_engine) for p in ("a", "what is 12 + 30?", "write the word hello in capital letters",
                                                   "sort 3 1 2", "yes", "tool call please find the city weather")]
    serial = [gen(tiny_engine, p, temperature=1.0, max_tokens=10 + i, seed=i) for i, p in enumerate(prompts)]
    before = dict(tiny_engine.generator.stats)

    async def concurrent():
        return await asyncio.gather(*[
            tiny_engine.generate(p, SamplingParams(temperature=1.0, max_tokens=10 + i, seed=i))
            for i, p in enumerate(prompts)])

    batched = asyncio.run(concurrent())
    assert tiny_engine.generator.stats["generate_batches"] - before["generate_batches"] < len(prompts)  # really batched
    for s, b in zip(serial, batched, strict=True):
        assert b.token_ids == s.token_ids
        assert max(abs(x - y) for x, y in zip(b.logprobs, s.logprobs, strict=True)) < 1e-4


def test_invalid_requests_fail_clearly(tiny_engine: ComposedEngine) -> None:
    with pytest.raises(ValueError, match="empty"):
        gen(tiny_engine, [], max_tokens=3)
    with pytest.raises(ValueError, match="context"):
        gen(tiny_engine, [5] * (tiny_engine.max_context + 1), max_tokens=3)
    with pytest.raises(ValueError, match="token ids"):
        gen(tiny_engine, [10**9], max_tokens=3)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)


def _sample(engine: ComposedEngine, ids: list[int], seed: int, advantage: float, temperature: float = 1.0) -> TrainSample:
    r = gen(engine, ids, temperature=temperature, max_tokens=16, seed=seed)
    n = len(ids)
    return TrainSample(
        input_ids=ids + r.token_ids,
        loss_mask=[0] * n + [1] * len(r.token_ids),
        behaviour_logprobs=[0.0] * n + r.logprobs,
        advantages=[0.0] * n + [advantage] * len(r.token_ids),
        temperature=temperature,
    )


def test_train_step_lowers_loss_on_fixed_batch(tiny_engine: ComposedEngine, chat_ids) -> None:
    ids = chat_ids("what is 4 + 4?", tiny_engine)
    batch = [_sample(tiny_engine, ids, s, adv) for s, adv in ((1, 1.0), (2, -1.0), (3, 1.0), (4, -1.0))]
    tiny_engine.set_learning_rate(1e-3)
    before = run_blocking(tiny_engine.learner.score(batch))
    losses = [asyncio.run(tiny_engine.train_step(batch))["loss"] for _ in range(4)]
    after = run_blocking(tiny_engine.learner.score(batch))
    assert losses[-1] < losses[0]
    assert tiny_engine.policy_version == 4
    for s, b, a in zip(batch, before, after, strict=True):
        delta = sum(a) - sum(b)
        assert delta > 0 if s.advantages[-1] > 0 else delta < 0  # pushed up / down by the advantage sign


def test_masked_tokens_do_not_affect_the_update(tiny_model_path: Path, chat_ids) -> None:
    engines = [embedded_engine(tiny_model_path) for _ in range(2)]
    ids = chat_ids("hi", engines[0])
    base = _sample(engines[0], ids, 3, 1.0)
    noisy = TrainSample(base.input_ids, base.loss_mask,
                        [lp if m else -50.0 for lp, m in zip(base.behaviour_logprobs, base.loss_mask, strict=True)],
                        [a if m else 123.0 for a, m in zip(base.advantages, base.loss_mask, strict=True)])
    for engine, sample in zip(engines, (base, noisy), strict=True):
        engine.set_learning_rate(1e-3)
        asyncio.run(engine.train_step([sample]))
    for p, q in zip(engines[0].generator.model.parameters(), engines[1].generator.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_kl_and_bf16_options_run(tiny_model_path: Path, chat_ids) -> None:
    engine = engine_of(tiny_model_path, autocast_bf16=True, loss=LossSettings(kl_coef=0.1), learning_rate=1e-3)
    ids = chat_ids("hi", engine)
    batch = [_sample(engine, ids, 1, 1.0)]
    first = asyncio.run(engine.train_step(batch))
    second = asyncio.run(engine.train_step(batch))
    assert first["kl"] == pytest.approx(0.0, abs=1e-3)  # identical to the reference at step 0
    assert second["kl"] > 0


def test_lora_trains_only_adapters(tiny_model_path: Path, chat_ids, tmp_path: Path) -> None:
    engine = engine_of(tiny_model_path, lora=LoraSettings(rank=4, alpha=8))
    engine.set_learning_rate(1e-2)
    frozen = {n: p.clone() for n, p in engine.generator.model.named_parameters() if not p.requires_grad}
    lora = {n: p.clone() for n, p in engine.generator.model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora)
    ids = chat_ids("hi", engine)
    asyncio.run(engine.train_step([_sample(engine, ids, 1, 1.0)]))
    named = dict(engine.generator.model.named_parameters())
    assert all(torch.equal(named[n], p) for n, p in frozen.items())
    assert any(not torch.equal(named[n], p) for n, p in lora.items())
    engine.save(tmp_path / "ckpt")
    other = engine_of(tiny_model_path, lora=LoraSettings(rank=4, alpha=8))
    other.load(tmp_path / "ckpt")
    other_named = dict(other.generator.model.named_parameters())
    assert all(torch.equal(other_named[n], named[n]) for n in lora)


def test_save_load_round_trip(tiny_model_path: Path, chat_ids, tmp_path: Path) -> None:
    engine = embedded_engine(tiny_model_path)
    engine.set_learning_rate(1e-3)
    ids = chat_ids("what is 1 + 1?", engine)
    batch = [_sample(engine, ids, 1, 1.0), _sample(engine, ids, 2, -1.0)]
    asyncio.run(engine.train_step(batch))
    engine.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "config.json").exists() and (tmp_path / "ckpt" / "tokenizer.json").exists()

    fresh = embedded_engine(tiny_model_path)
    fresh.set_learning_rate(1e-3)
    fresh.load(tmp_path / "ckpt")
    assert fresh.policy_version == 1
    for p, q in zip(engine.generator.model.state_dict().values(), fresh.generator.model.state_dict().values(), strict=True):
        assert torch.equal(p, q)
    # the optimizer state came back too: the next step is identical on both
    asyncio.run(engine.train_step(batch))
    asyncio.run(fresh.train_step(batch))
    for p, q in zip(engine.generator.model.parameters(), fresh.generator.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)
    # the checkpoint is a plain Hugging Face directory
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").config.vocab_size == engine.generator.model.config.vocab_size


@pytest.mark.slow
def test_smollm2_generate_and_train() -> None:
    engine = embedded_engine("smollm2-135m-instruct")
    ids = list(engine.tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}],
                                                    add_generation_prompt=True, tokenize=True, return_dict=False))
    r = gen(engine, ids, temperature=0.8, max_tokens=16, seed=0)
    assert r.token_ids
    ref = teacher_forced_logprobs(engine, ids, r.token_ids, 0.8)
    assert max(abs(a - b) for a, b in zip(r.logprobs, ref, strict=True)) < 1e-4
    s = TrainSample(ids + r.token_ids, [0] * len(ids) + [1] * len(r.token_ids), [0.0] * len(ids) + r.logprobs,
                    [0.0] * len(ids) + [1.0] * len(r.token_ids), temperature=0.8)
    metrics = asyncio.run(engine.train_step([s]))
    assert metrics["mean_abs_logprob_diff"] < 1e-3  # the trainer reproduces the sampler's logprobs
    assert engine.policy_version == 1
