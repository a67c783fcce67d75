"""One frozen base, several named LoRA adapters in the embedded engine (``layouts/adapters.py``): mixed-adapter
batches, per-adapter training, versions, exports and checkpoints, adapters added and removed at run time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from agentjet.engines.base import GenerationResult, SamplingParams, TrainSample
from agentjet.engines.errors import GenerationError
from agentjet.engines.model import adapter_parameters
from agentjet.layouts.adapters import AdapterEngines, adapter_engines
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import (
    GeneratorSettings,
    LearnerSettings,
    LoraSettings,
    LossSettings,
    PlacementSettings,
)

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
PROMPTS = [[1, 5, 9, 13, 17], [2, 4, 8, 16, 32, 64], [3, 6, 12, 24]]


def make(model: Path, adapters: list[str], rank: int = 4, kl_coef: float = 0.0, **generator) -> AdapterEngines:
    """On the CPU in float32 on every machine: the comparisons below are to fp32 noise."""
    engines = adapter_engines(model, adapters, GeneratorSettings(**{"max_batch_size": 8, **generator}),
                              LearnerSettings(lora=LoraSettings(rank=rank), learning_rate=5e-2),
                              LossSettings(kl_coef=kl_coef), PlacementSettings(device="cpu", dtype="float32"))
    engines.generator.rules.stop_ids = frozenset()  # no EOS: every row generates all its tokens, side by side
    return engines


@pytest.fixture
def two(tiny_model_path: Path) -> Iterator[AdapterEngines]:
    engines = make(tiny_model_path, ["A", "B"])
    randomise(engines, "A", seed=1)
    randomise(engines, "B", seed=2)
    yield engines
    run_blocking(engines.close())


def randomise(engines: AdapterEngines, name: str, seed: int) -> None:
    """Give adapter ``name`` random weights (fresh LoRA is the base: B = 0), so adapters differ."""
    def fill() -> None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in adapter_parameters(engines.generator.model, name):
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)

    engines.generator.worker.run_sync(fill)


def generate(engines: AdapterEngines, rows: list[tuple[str, list[int]]],
             sampling: SamplingParams | list[SamplingParams] = GREEDY) -> list[GenerationResult]:
    """The rows submitted together (one burst: they share prefills and decode steps); one sampling for all, or
    one per row."""
    each = sampling if isinstance(sampling, list) else [sampling] * len(rows)

    async def burst() -> list[GenerationResult]:
        return list(await asyncio.gather(*[engines.generator.generate(p, s, adapter=a)
                                           for (a, p), s in zip(rows, each, strict=True)]))

    return run_blocking(burst())


def sample_of(prompt: list[int], res: GenerationResult, advantage: float = 1.0) -> TrainSample:
    n = len(res.token_ids)
    return TrainSample(input_ids=prompt + res.token_ids, loss_mask=[0] * len(prompt) + [1] * n,
                       behaviour_logprobs=[0.0] * len(prompt) + res.logprobs, advantages=[advantage] * (len(prompt) + n))


def step(engines: AdapterEngines, name: str) -> None:
    """One train step of adapter ``name`` on its own greedy reply to the first prompt."""
    engine = engines.engine(name)
    res = generate(engines, [(name, PROMPTS[0])])[0]
    run_blocking(engine.train_step([sample_of(PROMPTS[0], res, 1.0), sample_of(PROMPTS[0], res, -0.5)]))


def score(engines: AdapterEngines, name: str, sample: TrainSample) -> list[float]:
    return run_blocking(engines.engine(name).learner.score([sample]))[0]


def test_mixed_batch_gives_each_row_what_its_adapter_alone_gives(two: AdapterEngines) -> None:
    stats = two.generator.stats
    before = stats["mixed_adapter_steps"]
    mixed = generate(two, [("A", PROMPTS[0]), ("B", PROMPTS[1]), ("A", PROMPTS[2]), ("B", PROMPTS[2])])
    after = two.generator.stats
    assert after["mixed_adapter_steps"] - before == GREEDY.max_tokens - 1  # every decode step held A and B rows
    assert after["decode_rows"] - stats["decode_rows"] == 4 * (GREEDY.max_tokens - 1)
    alone_a = generate(two, [("A", PROMPTS[0]), ("A", PROMPTS[2])])
    alone_b = generate(two, [("B", PROMPTS[1]), ("B", PROMPTS[2])])
    for got, want in zip(mixed, [alone_a[0], alone_b[0], alone_a[1], alone_b[1]], strict=True):
        assert got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
    # the adapters differ (so the comparison above could fail): B on A's prompt is not A
    other = generate(two, [("B", PROMPTS[0])])[0]
    assert max(abs(x - y) for x, y in zip(other.logprobs, mixed[0].logprobs, strict=False)) > 1e-3


def test_per_row_lora_matches_peft_mixed_batches(two: AdapterEngines) -> None:
    """The per-row LoRA (stacked adapters, row masks) gives what PEFT's adapter_names gives, also once rows have
    finished and left base rows between the others (the single-adapter path with a row mask, too)."""
    runner = two.generator.core.runner
    assert runner is not None and runner.adapters.row_lora is not None
    short, long = SamplingParams(temperature=0.0, max_tokens=4), SamplingParams(temperature=0.0, max_tokens=12)
    cases = [([("A", PROMPTS[0]), ("B", PROMPTS[1]), ("A", PROMPTS[2]), ("B", PROMPTS[2])], [short, long, long, short]),
             ([("A", PROMPTS[0]), ("A", PROMPTS[1])], [short, long])]
    for rows, sampling in cases:
        ours = generate(two, rows, sampling)
        runner.adapters.prefer_peft_rows = True
        try:
            peft = generate(two, rows, sampling)
        finally:
            runner.adapters.prefer_peft_rows = False
        for got, want in zip(ours, peft, strict=True):
            assert got.token_ids == want.token_ids
            assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
    assert "per-row LoRA" in two.describe()["mixed_adapter_batches"]


def test_an_adapter_engine_generates_with_its_own_adapter_only(two: AdapterEngines) -> None:
    a = two.engine("A")
    via_engine = run_blocking(a.generate(PROMPTS[0], GREEDY))
    assert via_engine.token_ids == generate(two, [("A", PROMPTS[0])])[0].token_ids
    with pytest.raises(GenerationError, match="not 'B'") as other:
        run_blocking(a.generate(PROMPTS[0], GREEDY, adapter="B"))
    assert other.value.param == "model"
    with pytest.raises(GenerationError, match="no LoRA adapter 'Z'"):
        generate(two, [("Z", PROMPTS[0])])
    assert (a.tokenizer, a.max_context, a.generator.capacity) == (two.tokenizer, two.max_context, 8)


@pytest.mark.parametrize("names", [["__base__", "A"], ["A", "B", "__base__"], ["B", "B"], ["__base__", "__base__"]])
def test_row_lora_forward_matches_peft_adapter_names(two: AdapterEngines, names: list[str]) -> None:
    """One forward, row by row, against PEFT's mixed batch: base rows get the base, each other row its adapter."""
    runner = two.generator.core.runner
    assert runner is not None and runner.adapters.row_lora is not None
    row_lora, model = runner.adapters.row_lora, two.generator.model
    ids = torch.tensor([PROMPTS[0][:4]] * len(names))

    def both() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            with row_lora.rows(names):
                ours = model(input_ids=ids).logits
            return ours, model(input_ids=ids, adapter_names=names).logits

    ours, peft = two.generator.worker.run_sync(both)
    assert torch.allclose(ours, peft, atol=1e-5, rtol=1e-5)


def test_a_step_of_one_adapter_leaves_the_other_unchanged(two: AdapterEngines) -> None:
    b_before = generate(two, [("B", PROMPTS[1])])[0]
    probe = sample_of(PROMPTS[1], b_before)
    a_before = score(two, "A", probe)
    mixed_before = generate(two, [("A", PROMPTS[0]), ("B", PROMPTS[1])])  # the stacked adapters are made
    step(two, "A")
    b_after = generate(two, [("B", PROMPTS[1])])[0]
    assert b_after.token_ids == b_before.token_ids
    assert b_after.logprobs == b_before.logprobs  # the same computation on the same weights: to the bit
    a_after = score(two, "A", probe)
    assert max(abs(x - y) for x, y in zip(a_after, a_before, strict=True)) > 1e-4
    # a mixed batch serves A's new weights (its stacked copy was made again), B's unchanged ones
    mixed_after = generate(two, [("A", PROMPTS[0]), ("B", PROMPTS[1])])
    a_alone = generate(two, [("A", PROMPTS[0])])[0]
    assert mixed_after[0].token_ids == a_alone.token_ids
    assert mixed_after[0].logprobs == pytest.approx(a_alone.logprobs, abs=1e-5)
    assert mixed_after[0].logprobs != pytest.approx(mixed_before[0].logprobs, abs=1e-4)
    assert mixed_after[1].token_ids == mixed_before[1].token_ids
    assert mixed_after[1].logprobs == pytest.approx(mixed_before[1].logprobs, abs=1e-5)
    # each adapter has its own version, on the results too
    assert two.generator.adapter_versions == {"A": 1, "B": 0}
    assert two.engine("A").policy_version == 1 and two.engine("B").policy_version == 0
    ra, rb = generate(two, [("A", PROMPTS[0]), ("B", PROMPTS[0])])
    assert (ra.policy_version, rb.policy_version) == (1, 0)
    assert set(ra.versions) == {1} and set(rb.versions) == {0}


def test_add_and_remove_adapters_at_run_time(two: AdapterEngines) -> None:
    long = SamplingParams(temperature=0.0, max_tokens=300)

    async def scenario() -> tuple[GenerationResult, GenerationResult, BaseException | GenerationResult, int]:
        streamed = asyncio.Event()
        b_tokens: list[int] = []

        def on_b(token: int, _lp: float) -> None:
            b_tokens.append(token)
            if len(b_tokens) == 3:
                streamed.set()

        running_a = asyncio.ensure_future(two.engine("A").generate(PROMPTS[0], long))
        running_b = asyncio.ensure_future(two.engine("B").generate(PROMPTS[1], long, on_b))
        await streamed.wait()  # both are generating
        c = await two.add("C", rank=2)
        got_c = await c.generate(PROMPTS[2], GREEDY)
        await two.remove("B")
        b_outcome = (await asyncio.gather(running_b, return_exceptions=True))[0]
        return await running_a, got_c, b_outcome, len(b_tokens)

    got_a, got_c, b_outcome, b_streamed = run_blocking(scenario())
    assert len(got_a.token_ids) == 300  # A went on through both changes
    assert len(got_c.token_ids) == GREEDY.max_tokens and got_c.policy_version == 0
    assert two.names() == ["A", "C"]
    # B's running request failed cleanly part-way, and later ones are refused, naming the adapters
    assert isinstance(b_outcome, GenerationError) and b_outcome.param == "model", b_outcome
    assert "removed" in str(b_outcome) and 3 <= b_streamed < 300
    with pytest.raises(GenerationError, match="'B'") as refused:
        generate(two, [("B", PROMPTS[0])])
    assert refused.value.param == "model" and "'A', 'C'" in str(refused.value)
    with pytest.raises(ValueError, match=r"adapters are \['A', 'C'\]"):
        two.engine("B")
    # C trains (its own rank) and A still generates as before
    step(two, "C")
    assert two.generator.adapter_versions == {"A": 0, "C": 1}
    assert [p.shape[0] for p in adapter_parameters(two.generator.model, "C")][:1] == [2]
    assert generate(two, [("A", PROMPTS[0])])[0].token_ids == got_a.token_ids[:GREEDY.max_tokens]


def test_removing_the_last_adapter_and_naming_none_are_refused(tiny_model_path: Path) -> None:
    engines = make(tiny_model_path, ["solo"])
    try:
        with pytest.raises(ValueError, match="last one"):
            run_blocking(engines.remove("solo"))
        with pytest.raises(GenerationError, match="name one") as none:
            generate(engines, [(None, PROMPTS[0])])  # type: ignore[list-item]
        assert none.value.param == "model"
        assert generate(engines, [("solo", PROMPTS[0])])[0].token_ids
    finally:
        run_blocking(engines.close())


def test_export_adapter_loads_with_peft_and_gives_its_logprobs(two: AdapterEngines, tiny_model_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    step(two, "A")
    res = generate(two, [("A", PROMPTS[2])])[0]
    probe = sample_of(PROMPTS[2], res)
    want = score(two, "A", probe)
    path = run_blocking(two.engine("A").learner.export_adapter())
    assert sorted(p.name for p in path.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert json.loads((path / "adapter_config.json").read_text())["r"] == 4
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, path).eval()
    ids = torch.tensor([probe.input_ids])
    with torch.no_grad():
        logp = loaded(input_ids=ids).logits[0].float().log_softmax(-1)
    n = len(PROMPTS[2])
    got = [float(logp[n - 1 + i, t]) for i, t in enumerate(res.token_ids)]
    assert got == pytest.approx(want, abs=1e-5)
    # the merged export: the base with A alone merged, as a plain model directory
    merged_dir = run_blocking(two.engine("A").learner.export_weights("float32"))
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = merged(input_ids=ids).logits[0].float().log_softmax(-1)
    assert [float(logp[n - 1 + i, t]) for i, t in enumerate(res.token_ids)] == pytest.approx(want, abs=1e-4)
    assert generate(two, [("A", PROMPTS[2])])[0].logprobs == res.logprobs  # the live module was not merged


def test_save_and_load_restore_one_adapter_only(two: AdapterEngines, tmp_path: Path) -> None:
    probe = sample_of(PROMPTS[1], generate(two, [("A", PROMPTS[1])])[0])
    step(two, "A")
    saved_a = score(two, "A", probe)
    two.engine("A").save(tmp_path / "a")
    assert (tmp_path / "a" / "adapter_model.safetensors").exists()
    step(two, "A")
    step(two, "B")
    b_now = score(two, "B", probe)
    assert score(two, "A", probe) != pytest.approx(saved_a, abs=1e-6)
    two.engine("A").load(tmp_path / "a")
    assert score(two, "A", probe) == pytest.approx(saved_a, abs=1e-6)
    assert score(two, "B", probe) == b_now  # B untouched, to the bit
    assert two.generator.adapter_versions == {"A": 1, "B": 1}
    assert two.engine("A").policy_version == 1
    step(two, "A")  # its optimizer came back with it: training goes on
    assert two.engine("A").policy_version == 2


def test_kl_reference_is_the_base(tiny_model_path: Path) -> None:
    engines = make(tiny_model_path, ["A", "B"], kl_coef=0.1)
    try:
        randomise(engines, "B", seed=3)
        res = generate(engines, [("A", PROMPTS[0])])[0]
        out = run_blocking(engines.engine("A").train_step([sample_of(PROMPTS[0], res)]))
        assert out["kl"] == pytest.approx(0.0, abs=1e-6)  # A was the base (B = 0) when the step began
        out = run_blocking(engines.engine("B").train_step([sample_of(PROMPTS[0], res)]))
        assert out["kl"] > 1e-4  # B differs from the base
    finally:
        run_blocking(engines.close())


def test_adapters_refuse_what_they_cannot_do(tiny_model_path: Path) -> None:
    with pytest.raises(ValueError, match="--lora-rank N"):
        adapter_engines(tiny_model_path, ["A"], learner=LearnerSettings())
    with pytest.raises(ValueError, match="generator.batching is 'static'"):
        adapter_engines(tiny_model_path, ["A"], GeneratorSettings(batching="static"),
                        LearnerSettings(lora=LoraSettings(rank=2)))
    with pytest.raises(ValueError, match="adapter name"):
        adapter_engines(tiny_model_path, ["a.b"], learner=LearnerSettings(lora=LoraSettings(rank=2)))


def test_a_kept_prefix_serves_its_own_adapter_only_and_stays_exact(two: AdapterEngines) -> None:
    """An adapter's next call reuses that adapter's kept keys (through the per-row LoRA); another adapter's call on
    the same tokens prefills them again: its keys are not the same."""
    prompt = torch.randint(10, 1000, (300,), generator=torch.Generator().manual_seed(3)).tolist()
    sampled = [SamplingParams(temperature=1.0, max_tokens=12, seed=s) for s in (1, 2)]
    first = generate(two, [("A", prompt)], sampled[:1])[0]
    follow = [*prompt, *first.token_ids, *range(20, 70)]
    before = dict(two.generator.stats)
    a, b = generate(two, [("A", follow), ("B", follow)], sampled)
    stats = two.generator.stats
    assert stats["prefix_hits"] - before["prefix_hits"] == 1  # A's; B had nothing kept
    assert stats["prefix_reused_tokens"] - before["prefix_reused_tokens"] == len(prompt) + len(first.token_ids) - 1
    for name, res in (("A", a), ("B", b)):
        assert res.logprobs == pytest.approx(score(two, name, sample_of(follow, res)), abs=1e-4)
