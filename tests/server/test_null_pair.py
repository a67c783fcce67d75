"""The null pair (``layouts/null.py``): a null generator and a null learner composed like the real layouts."""

from __future__ import annotations

from transformers import AutoTokenizer

from agentjet.engines.base import SamplingParams, TrainSample
from agentjet.layouts.null import null_engine
from agentjet.runtime.blocking import run_blocking


def sample() -> TrainSample:
    return TrainSample([1, 2, 3], [0, 1, 1], [0.0, -0.1, -0.1], [0.0, 1.0, 1.0])


def test_a_reply_that_spans_an_update_moves_the_engine_with_the_generator(tiny_model_path) -> None:
    engine = null_engine(AutoTokenizer.from_pretrained(tiny_model_path), reply="one two three", update_at_token=2)
    res = run_blocking(engine.generate([5, 6], SamplingParams()))
    n = len(engine.generator.reply_ids)
    assert res.policy_version == 0 and res.versions == [0, 0] + [1] * (n - 2)
    assert engine.policy_version == engine.generator.policy_version == engine.learner.policy_version == 1
    assert list(engine.generator.prompts) == [[5, 6]]


def test_a_step_moves_both_versions_and_keeps_the_batch(tiny_model_path, tmp_path) -> None:
    engine = null_engine(AutoTokenizer.from_pretrained(tiny_model_path))
    out = run_blocking(engine.train_step([sample()]))
    assert out["policy_version"] == 1 and out["samples"] == 1 and out["loss"] == 0.0
    assert engine.policy_version == engine.generator.policy_version == 1 and len(engine.learner.trained) == 1
    assert engine.weight_sync is None and engine.layout == "null+null"  # no seam counts: the status says null
    engine.save(tmp_path / "ckpt")
    fresh = null_engine(AutoTokenizer.from_pretrained(tiny_model_path))
    fresh.load(tmp_path / "ckpt")  # the learner's version, then the generator's through the seam
    assert fresh.policy_version == fresh.generator.policy_version == 1
    res = run_blocking(fresh.generate([5], SamplingParams(max_tokens=1)))
    assert res.policy_version == 1 and res.finish_reason == "length"
    run_blocking(engine.close())
