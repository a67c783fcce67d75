"""The vLLM adapter's pure parts: weight export, TIS weights and mismatch statistics, the probe, settings."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from agentjet.algorithms.objectives import Correction
from agentjet.engines.base import TrainSample
from agentjet.generators.vllm import VLLMSettings
from agentjet.generators.vllm.probe import compare, probe_prompt_ids
from agentjet.learners.policy_step import StepConfig, micro_batch_loss
from agentjet.settings import LearnerSettings, LossSettings
from agentjet.weights.io import export_full, prune_versions, version_dir

LR = LearnerSettings(learning_rate=1e-3)


def test_export_full_is_untied_and_reloads_to_the_same_model(tiny_engine, tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_engine.generator.model
    assert model.config.tie_word_embeddings
    out = export_full(model, tiny_engine.tokenizer, tmp_path / "v000003", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    from safetensors.torch import load_file

    state = load_file(str(out / "model.safetensors"))
    assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 17, 33]])
    with torch.no_grad():
        assert torch.allclose(reloaded(ids).logits, model(ids).logits, atol=1e-5)
    assert (out / "tokenizer.json").exists() and not list(tmp_path.glob(".*.tmp"))


def test_export_casts_to_the_served_dtype(tiny_engine, tmp_path):
    from safetensors.torch import load_file

    out = export_full(tiny_engine.generator.model, tiny_engine.tokenizer, tmp_path / "v000001", dtype="bfloat16")
    assert {t.dtype for t in load_file(str(out / "model.safetensors")).values()} == {torch.bfloat16}
    assert tiny_engine.generator.model.model.embed_tokens.weight.dtype == torch.float32  # the trainer's copy is untouched


def test_prune_keeps_the_newest_and_the_protected(tmp_path):
    for v in range(5):
        version_dir(tmp_path, v).mkdir()
    (tmp_path / "notes").mkdir()
    removed = prune_versions(tmp_path, keep=2, protect={version_dir(tmp_path, 1)})
    assert sorted(p.name for p in removed) == ["v000000", "v000002"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "v000001", "v000003", "v000004"]


def test_auto_correction_is_tis_on_vllm_in_the_one_policy_step():
    """``loss.correction: auto`` (the default) is TIS with the cap ``correction_high`` on the vLLM generator and
    none on the embedded one; a correction the loss names wins on either. With TIS the ratio is taken against the
    trainer's detached logprobs (1 in the one update) and each token's policy-gradient term is weighted by
    min(p_trainer / p_behaviour, cap), so the gradient of token t is -weight * adv_t * w_t. No separate scoring
    pass: the step's own forward gives the proximal."""
    sample = TrainSample(input_ids=[1, 2, 3, 4], loss_mask=[0, 0, 1, 1], behaviour_logprobs=[0.0, 0.0, -1.0, -2.0],
                         advantages=[0.0, 0.0, 0.5, 0.5], temperature=0.7, weight=0.5)
    vllm = StepConfig.from_settings(LR, LossSettings(), separate_sampler=True)
    assert vllm.loss.correction is Correction.TIS and vllm.loss.correction_high == 2.0
    masked = StepConfig.from_settings(LR, LossSettings(correction="mask_token"), True)
    assert masked.loss.correction is Correction.MASK_TOKEN  # the loss's own choice wins
    off = StepConfig.from_settings(LR, LossSettings(correction="none"), True)
    assert off.loss.correction is Correction.NONE  # none is none on vLLM too
    assert StepConfig.from_settings(LR, LossSettings()).loss.correction is Correction.NONE
    # a live change keeps the path: auto is still tis on the vLLM generator
    assert off.with_loss(LossSettings(correction_high=3.0)).loss.correction_high == 3.0
    assert off.with_loss(LossSettings()).loss.correction is Correction.TIS
    lp = torch.tensor([-1.5, -0.5], requires_grad=True)
    res = micro_batch_loss(lp, [sample], vllm)
    res.loss_sum.backward()
    w = [math.exp(-0.5), 2.0]  # e^1.5 is capped at 2
    assert lp.grad.tolist() == pytest.approx([-0.5 * 0.5 * w[0], -0.5 * 0.5 * w[1]])
    assert res.is_weight_sum == pytest.approx(sum(w)) and res.masked == 0.0
    assert res.abs_logprob_diff_sum == pytest.approx(0.5 + 1.5)  # |trainer - behaviour|, not against the proximal
    res2 = micro_batch_loss(torch.tensor([-1.5, -0.5], requires_grad=True), [sample],
                            StepConfig.from_settings(LR, LossSettings()))
    assert res2.is_weight_sum == 2.0 and res2.mismatch_kl_sum > 0 and res2.clipped > 0  # PPO against behaviour


def test_probe_prompt_spans_more_than_one_cpu_kv_block(tiny_engine):
    ids = probe_prompt_ids(tiny_engine.tokenizer, max_context=4096)
    assert len(ids) == 200 and ids == probe_prompt_ids(tiny_engine.tokenizer, max_context=4096)
    assert len(probe_prompt_ids(tiny_engine.tokenizer, max_context=100)) == 50


def test_probe_compare_reports_the_worse_part():
    r = compare([-1.0, -2.0], [-0.5], [-1.0, -2.1, -1.5])
    assert r.prompt_diff == pytest.approx(0.05) and r.gen_diff == pytest.approx(1.0) and r.diff == pytest.approx(1.0)
    with pytest.raises(ValueError):
        compare([-1.0], [-1.0], [-1.0])


def test_settings_are_validated():
    with pytest.raises(ValidationError):
        VLLMSettings(probe_threshold=0)
    with pytest.raises(ValidationError):
        VLLMSettings(pause_mode="later")
    with pytest.raises(ValidationError):
        VLLMSettings(unknown=1)
    assert VLLMSettings().python.name == "python"


def test_vllm_tmpdir_stays_short_enough_for_its_unix_sockets(tmp_path):
    """vLLM puts ZMQ sockets named by a uuid in TMPDIR; a unix socket path holds at most 107 bytes. A run
    directory too deep for that gets a private short directory instead, removed when vLLM stops."""
    from agentjet.generators.vllm.launch import MAX_SOCKET_DIR, VLLMLaunch

    def launch(work: Path) -> VLLMLaunch:  # no process: only the directory rule is exercised
        return VLLMLaunch(VLLMSettings(), work / "model", work, 8000, seed=0, uses_lora=False,
                          max_context=lambda: 2048)

    import shutil
    import tempfile

    short = Path(tempfile.mkdtemp(prefix="aj-"))
    try:
        assert launch(short).tmp_dir() == short / "tmp"  # in the run's directory when it fits
    finally:
        shutil.rmtree(short)
    deep = launch(tmp_path / ("d" * 80) / "vllm")
    tmp = deep.tmp_dir()
    assert len(str(tmp)) <= MAX_SOCKET_DIR and len(str(tmp)) + 1 + 36 <= 107 and tmp.is_dir()
    deep.cleanup()
    assert not tmp.exists()
