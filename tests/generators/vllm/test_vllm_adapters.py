"""VLLMAdapters (layouts/vllm_adapters.py) against the fake vLLM (tests/generators/vllm/fake_vllm.py): requests routed by
adapter to its versioned LoRA name, per-adapter pushes, probes and versions, add and remove, and the refusals
(rank above --max-lora-rank, more adapters than --max-loras holds)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from tests.generators.vllm.fake import fake_config
from tests.generators.vllm.test_vllm_engine import prompt

from agentjet.engines.base import SamplingParams, TrainSample
from agentjet.engines.errors import GenerationError
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import LoraSettings


def lora_calls(adapters) -> list[tuple[str, str]]:
    calls = httpx.get(f"{adapters.vllm.url}/calls").json()
    return [(c["route"], c["lora_name"]) for c in calls if c["route"].endswith("lora_adapter")]


@pytest.fixture
def make_adapters(tmp_path: Path, tiny_model_path: Path):
    from agentjet.layouts.vllm_adapters import vllm_adapters

    made = []

    def make(names=("alpha", "beta"), rank: int = 4, **settings):
        config = fake_config(tiny_model_path, LoraSettings(rank=rank, alpha=2 * rank, adapters=list(names)), lr=2e-2,
                             **settings)
        config = config.model_copy(update={"data_dir": tmp_path})
        adapters = vllm_adapters(config, tmp_path / f"vllm{len(made)}")
        made.append(adapters)
        return adapters

    yield make
    for adapters in made:
        run_blocking(adapters.close())


async def batch_of(engine, n: int = 4) -> list[TrainSample]:
    """Samples from the adapter's own generations, advantages +1 / -1."""
    ids = prompt(engine)
    out = []
    for i in range(n):
        res = await engine.generate(ids, SamplingParams(temperature=1.0, max_tokens=8, seed=i))
        seq = ids + res.token_ids
        mask = [0] * len(ids) + [1] * len(res.token_ids)
        out.append(TrainSample(seq, mask, [0.0] * len(ids) + res.logprobs,
                               [(1.0 if i % 2 == 0 else -1.0) * m for m in mask]))
    return out


def greedy(engine) -> list[float]:
    res = run_blocking(engine.generate(prompt(engine), SamplingParams(temperature=0.0, max_tokens=6)))
    return res.logprobs


def test_each_adapter_is_served_under_its_versioned_name_and_pushed_alone(make_adapters):
    adapters = make_adapters()
    assert adapters.names() == ["alpha", "beta"]
    assert adapters.vllm.launch.max_loras == 4  # 2 per adapter
    argv = adapters.vllm.launch.spec().argv
    assert argv[argv.index("--max-loras") + 1] == "4"
    assert "alpha-v0=" in " ".join(argv) and "beta-v0=" in " ".join(argv)
    a, b = adapters.engine("alpha"), adapters.engine("beta")
    a_before, b_before = greedy(a), greedy(b)
    assert a_before == pytest.approx(b_before, abs=1e-5)  # two fresh adapters: the base
    assert adapters.vllm.request_body([1], SamplingParams(), adapters.vllm.served.current("beta"))["model"] == "beta-v0"

    out = run_blocking(a.train_step(run_blocking(batch_of(a))))
    assert out.metrics["probe_logprob_diff"] < 0.01  # the push was probed under the fake's threshold
    assert (a.policy_version, a.generator_version) == (1, 1)
    assert (b.policy_version, b.generator_version) == (0, 0)
    assert adapters.vllm.served.current("alpha") == "alpha-v1" and adapters.vllm.served.current("beta") == "beta-v0"
    assert lora_calls(adapters) == [("load_lora_adapter", "alpha-v1"), ("unload_lora_adapter", "alpha-v0")]
    res = run_blocking(a.generate(prompt(a), SamplingParams(max_tokens=2)))
    assert res.policy_version == 1
    assert greedy(a) != pytest.approx(a_before, abs=1e-4)  # a moved
    assert greedy(b) == pytest.approx(b_before, abs=1e-5)  # b did not
    a_after = greedy(a)
    run_blocking(b.train_step(run_blocking(batch_of(b))))
    assert (b.policy_version, b.generator_version, a.generator_version) == (1, 1, 1)
    assert greedy(a) == pytest.approx(a_after, abs=1e-5)  # b's step left a's outputs alone
    assert adapters.describe()["adapter_versions"] == {"alpha": 1, "beta": 1}


def test_requests_name_a_served_adapter(make_adapters):
    adapters = make_adapters()
    a = adapters.engine("alpha")
    with pytest.raises(GenerationError, match="'alpha', not 'beta'"):
        run_blocking(a.generate(prompt(a), SamplingParams(max_tokens=2), adapter="beta"))
    with pytest.raises(GenerationError, match="no LoRA adapter 'c'"):
        run_blocking(adapters.vllm.generate(prompt(a), SamplingParams(max_tokens=2), adapter="c"))
    with pytest.raises(ValueError, match="no LoRA adapter 'c'"):
        adapters.engine("c")


def test_add_and_remove_and_refusals(make_adapters):
    adapters = make_adapters(names=("alpha",), max_loras=4)
    with pytest.raises(ValueError, match="generator.vllm.lora_max_rank"):
        run_blocking(adapters.add("big", rank=128))
    with pytest.raises(ValueError, match="exists already"):
        run_blocking(adapters.add("alpha"))
    with pytest.raises(ValueError, match="train_unembed"):  # no LoRA on the output layer through vLLM
        run_blocking(adapters.add("head", unembed=True))
    c = run_blocking(adapters.add("c", rank=2))
    assert adapters.names() == ["alpha", "c"] and lora_calls(adapters) == [("load_lora_adapter", "c-v0")]
    res = run_blocking(c.generate(prompt(c), SamplingParams(max_tokens=2)))
    assert res.policy_version == 0
    with pytest.raises(ValueError, match="--max-loras is 4 .generator.vllm.max_loras"):
        run_blocking(adapters.add("d"))
    run_blocking(c.train_step(run_blocking(batch_of(c))))
    assert adapters.vllm.served.current("c") == "c-v1"
    run_blocking(adapters.remove("c"))
    assert adapters.names() == ["alpha"] and lora_calls(adapters)[-1] == ("unload_lora_adapter", "c-v1")
    assert "c" not in adapters.policy.model.peft_config
    with pytest.raises(GenerationError, match="no LoRA adapter 'c'"):
        run_blocking(adapters.vllm.generate(prompt(c), SamplingParams(max_tokens=2), adapter="c"))
    with pytest.raises(ValueError, match="last one"):
        run_blocking(adapters.remove("alpha"))


def test_start_refuses_what_vllm_cannot_serve(tmp_path: Path, tiny_model_path: Path):
    from agentjet.layouts.vllm_adapters import vllm_adapters

    lora = LoraSettings(rank=16, alpha=32, adapters=["alpha", "beta"])
    with pytest.raises(ValueError, match="generator.vllm.lora_max_rank"):
        vllm_adapters(fake_config(tiny_model_path, lora, lora_max_rank=8), tmp_path)
    with pytest.raises(ValueError, match="generator.vllm.max_loras is 3"):
        vllm_adapters(fake_config(tiny_model_path, lora, max_loras=3), tmp_path)


def test_settings_take_vllm_with_adapters_and_refuse_a_trainer_group(tiny_model_path: Path):
    lora = LoraSettings(rank=4, alpha=8, adapters=["alpha", "beta"])
    assert fake_config(tiny_model_path, lora).learner.lora.adapters == ["alpha", "beta"]
    with pytest.raises(ValueError, match="learner.group.procs 0"):
        fake_config(tiny_model_path, lora, train_procs=2)


def test_build_adapters_builds_vllm_adapters(tmp_path: Path, tiny_model_path: Path, monkeypatch):
    import agentjet.layouts.build as layout
    from agentjet.layouts import build_adapters

    seen = {}
    monkeypatch.setattr(layout, "vllm_adapters", lambda config, work_dir: seen.setdefault("work_dir", work_dir))
    config = fake_config(tiny_model_path, LoraSettings(rank=4, alpha=8, adapters=["alpha", "beta"]))
    assert build_adapters(config.model_copy(update={"data_dir": tmp_path})) == tmp_path / "vllm"


def test_pushes_of_two_adapters_at_once_each_probe_their_own(make_adapters):
    adapters = make_adapters()
    a, b = adapters.engine("alpha"), adapters.engine("beta")

    async def go():
        ba, bb = await batch_of(a), await batch_of(b)
        return await asyncio.gather(a.train_step(ba), b.train_step(bb))

    outs = run_blocking(go())
    assert all(o.metrics["probe_logprob_diff"] < 0.01 for o in outs)
    assert adapters.describe()["lora_names"] == {"alpha": "alpha-v1", "beta": "beta-v1"}
