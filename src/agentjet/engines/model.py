"""Loading a policy model: the tokenizer, the ``*ForCausalLM`` on its device and dtype, and LoRA adapters when
asked for. The embedded generator and the in-process learner load through here; when they share the module
(the single-process layout) it is loaded once and handed to both.

What a model directory says about its model (tokenizer, stop ids, context length, tied embeddings, generation
config) is read in one place, :func:`model_facts`, whether or not the weights are loaded in this process: the
policy model, the vLLM layouts and the trainer group all read it from there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from agentjet.models import resolve_model
from agentjet.settings import LearnerSettings, LoraSettings, PlacementSettings

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(setting: str) -> torch.device:
    """``auto`` -> CUDA when present, else CPU. An explicit CUDA device must exist."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(setting)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {setting!r} was asked for, but torch sees no CUDA device")
    return device


def resolve_dtype(setting: str, device: torch.device) -> torch.dtype:
    """``auto`` -> bfloat16 on CUDA, float32 on CPU."""
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[setting]


DEFAULT_CONTEXT_LENGTH = 4096  # a config without max_position_embeddings


@dataclass(frozen=True)
class ModelFacts:
    """What a model directory says about its model, read once by :func:`model_facts`."""

    path: Path  # the resolved model directory
    tokenizer: Any
    config: Any  # the transformers config (config.json)
    generation_config: Any | None  # generation_config.json, None when the directory has none
    stop_ids: frozenset[int]  # end-of-sequence ids: the generation config's and the tokenizer's
    context_length: int  # max_position_embeddings
    tie_word_embeddings: bool  # the output head shares the input embedding's weights

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    @property
    def chat_template(self) -> str | None:
        return self.tokenizer.chat_template


def model_facts(path: str | Path) -> ModelFacts:
    """Read a local model directory's facts (no weights). Stop ids come from the generation config as the loaded
    model has it: ``generation_config.json``, or without one what transformers derives from ``config.json``."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    path = Path(path)
    config = AutoConfig.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    generation_config = GenerationConfig.from_pretrained(path) if (path / "generation_config.json").exists() \
        else None
    as_loaded = generation_config if generation_config is not None else GenerationConfig.from_model_config(config)
    return ModelFacts(path=path, tokenizer=tokenizer, config=config, generation_config=generation_config,
                      stop_ids=frozenset(model_stop_ids(as_loaded, tokenizer)),
                      context_length=int(getattr(config, "max_position_embeddings", DEFAULT_CONTEXT_LENGTH)),
                      tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)))


@dataclass
class PolicyModel:
    """One copy of the weights and what goes with it."""

    facts: ModelFacts  # the directory's facts: path, tokenizer, stop ids, context length
    causal_lm: Any  # the *ForCausalLM: its decoder (``base_model``) and output head
    model: Any  # what is trained and run: the causal LM, or its PEFT wrapper under LoRA
    device: torch.device
    dtype: torch.dtype
    lora: LoraSettings | None  # the LoRA settings when adapters are trained, else None
    gradient_checkpointing: bool = False  # activations recomputed in backward (the learner's setting)

    @property
    def path(self) -> Path:
        return self.facts.path

    @property
    def tokenizer(self) -> Any:
        return self.facts.tokenizer

    @property
    def pad_id(self) -> int:
        return self.facts.pad_id


def model_stop_ids(generation_config: Any, tokenizer: Any) -> set[int]:
    """A model's end-of-sequence ids (its generation config's and its tokenizer's)."""
    ids: set[int] = set()
    for value in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(value)
    return ids


def with_lora(causal_lm: Any, lora: LoraSettings) -> Any:
    if not lora.enabled:
        return causal_lm
    from peft import LoraConfig, get_peft_model

    return get_peft_model(causal_lm, LoraConfig(r=lora.rank, lora_alpha=cast(int, lora.alpha),  # peft says int; it scales by alpha / r lora_dropout=lora.dropout,
                                                target_modules=list(lora.targets), task_type="CAUSAL_LM"))


def load_policy_model(model: str | Path, placement: PlacementSettings | None = None,
                      learner: LearnerSettings | None = None) -> PolicyModel:
    """The model named by ``model`` (a built-in name or a local directory), on ``placement``'s device and dtype,
    with the learner's LoRA adapters and gradient checkpointing."""
    from transformers import AutoModelForCausalLM

    path = resolve_model(str(model))
    placement = placement or PlacementSettings()
    settings = learner or LearnerSettings()
    device = resolve_device(placement.device)
    dtype = resolve_dtype(placement.dtype, device)
    facts = model_facts(path)
    causal_lm: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    causal_lm = causal_lm.to(device)
    causal_lm.eval()
    if settings.gradient_checkpointing:
        causal_lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return PolicyModel(facts=facts, causal_lm=causal_lm,
                       model=with_lora(causal_lm, settings.lora), device=device, dtype=dtype,
                       lora=settings.lora if settings.lora.enabled else None,
                       gradient_checkpointing=settings.gradient_checkpointing)
