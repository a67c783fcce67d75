"""A model directory's facts, read once (``engines.model.model_facts``): they agree with the model transformers
loads, and the layouts without the weights in process (vLLM with a trainer group) see the same as those with."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from agentjet.engines.model import ModelFacts, load_policy_model, model_facts, model_stop_ids
from agentjet.settings import PlacementSettings


@pytest.mark.tiny
def test_facts_agree_with_the_loaded_model(tiny_model_path: Path) -> None:
    facts = model_facts(tiny_model_path)
    policy = load_policy_model(tiny_model_path, PlacementSettings(device="cpu", dtype="float32"))
    lm = policy.causal_lm
    assert policy.facts.path == facts.path == Path(tiny_model_path)
    assert facts.stop_ids == frozenset(model_stop_ids(lm.generation_config, policy.tokenizer)) != frozenset()
    assert facts.context_length == lm.config.max_position_embeddings
    assert facts.tie_word_embeddings == bool(lm.config.tie_word_embeddings)
    assert facts.pad_id == policy.pad_id and facts.chat_template == policy.tokenizer.chat_template
    assert facts.generation_config is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.context_length = 1  # type: ignore[misc]


@pytest.mark.tiny
def test_without_a_generation_config_the_stop_ids_are_what_transformers_derives(tiny_model_path: Path,
                                                                                 tmp_path: Path) -> None:
    """No generation_config.json: the loaded model derives one from config.json, and so do the facts (the trainer
    group's vLLM layout used to see only the tokenizer's end id there)."""
    from transformers import AutoModelForCausalLM

    model = tmp_path / "m"
    shutil.copytree(tiny_model_path, model)
    (model / "generation_config.json").unlink()
    config = json.loads((model / "config.json").read_text())
    config["eos_token_id"] = 7  # not the tokenizer's
    (model / "config.json").write_text(json.dumps(config))
    facts: ModelFacts = model_facts(model)
    lm = AutoModelForCausalLM.from_pretrained(model)
    assert facts.generation_config is None
    assert 7 in facts.stop_ids and facts.stop_ids == frozenset(model_stop_ids(lm.generation_config, facts.tokenizer))


@pytest.mark.tiny
def test_the_untied_start_copy_keeps_the_directory_facts(tiny_model_path: Path, tmp_path: Path) -> None:
    from agentjet.weights.io import export_untied_copy

    facts = model_facts(tiny_model_path)
    copy = model_facts(export_untied_copy(facts, tmp_path / "v000000"))
    assert facts.tie_word_embeddings and not copy.tie_word_embeddings
    assert (copy.stop_ids, copy.context_length, copy.pad_id) == (facts.stop_ids, facts.context_length, facts.pad_id)
