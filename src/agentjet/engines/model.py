"""Loading a policy model: the tokenizer, the ``*ForCausalLM`` on its device and dtype, and LoRA adapters when
asked for. The embedded generator and the in-process learner load through here; when they share the module
(the single-process layout) it is loaded once and handed to both."""

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


@dataclass
class PolicyModel:
    """One copy of the weights and what goes with it."""

    path: Path  # the resolved model directory
    tokenizer: Any
    causal_lm: Any  # the *ForCausalLM: its decoder (``base_model``) and output head
    model: Any  # what is trained and run: the causal LM, or its PEFT wrapper under LoRA
    device: torch.device
    dtype: torch.dtype
    lora: LoraSettings | None  # the LoRA settings when adapters are trained, else None
    gradient_checkpointing: bool = False  # activations recomputed in backward (the learner's setting)

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    @property
    def context_length(self) -> int:
        return int(getattr(self.causal_lm.config, "max_position_embeddings", 4096))

    def stop_ids(self) -> set[int]:
        return model_stop_ids(getattr(self.causal_lm, "generation_config", None), self.tokenizer)


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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(str(model))
    placement = placement or PlacementSettings()
    settings = learner or LearnerSettings()
    device = resolve_device(placement.device)
    dtype = resolve_dtype(placement.dtype, device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    causal_lm: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    causal_lm = causal_lm.to(device)
    causal_lm.eval()
    if settings.gradient_checkpointing:
        causal_lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return PolicyModel(path=Path(path), tokenizer=tokenizer, causal_lm=causal_lm,
                       model=with_lora(causal_lm, settings.lora), device=device, dtype=dtype,
                       lora=settings.lora if settings.lora.enabled else None,
                       gradient_checkpointing=settings.gradient_checkpointing)
