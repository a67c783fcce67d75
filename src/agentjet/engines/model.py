"""Loading a policy model: the tokenizer, the ``*ForCausalLM`` on its device and dtype, and LoRA adapters when
asked for. The embedded generator and the in-process learner load through here; when they share the module
(the single-process layout) it is loaded once and handed to both.

What a model directory says about its model (tokenizer, stop ids, context length, tied embeddings, generation
config) is read in one place, :func:`model_facts`, whether or not the weights are loaded in this process: the
policy model, the vLLM layouts and the trainer group all read it from there."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from agentjet.models import resolve_model
from agentjet.settings import LearnerSettings, LoraSettings, PlacementSettings
from agentjet.settings.learner import check_adapter_name

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
    # the named LoRA adapters it was built with (``layouts/adapters.py``); empty: one policy (``model``)
    adapters: tuple[str, ...] = ()

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


def lora_config(lora: LoraSettings, rank: int | None = None, extra_targets: Sequence[str] = ()) -> Any:
    """PEFT's ``LoraConfig`` for the learner's LoRA settings; ``rank`` overrides the settings' rank (an adapter
    added at run time with its own); ``extra_targets``: module names adapted besides ``lora.targets``."""
    from peft import LoraConfig

    r = lora.rank if rank is None else rank
    if r <= 0:
        raise ValueError(f"a LoRA adapter needs a rank > 0 (got {r}): set --lora-rank N")
    # peft types lora_alpha as int; it scales by alpha / r, a float is fine
    return LoraConfig(r=r, lora_alpha=cast(int, lora.alpha), lora_dropout=lora.dropout,
                      target_modules=list(dict.fromkeys([*lora.targets, *extra_targets])), task_type="CAUSAL_LM")


def output_layer_name(model: Any) -> str:
    """The output layer's module name (``lm_head`` for Llama-style models), the last part of its path."""
    head = model.get_output_embeddings()
    for name, module in model.named_modules():
        if module is head:
            return name.rsplit(".", 1)[-1]
    raise ValueError("the model has no output layer among its modules")


def adapter_has_unembed(model: Any, name: str) -> bool:
    """Whether adapter ``name`` carries LoRA on the output layer (added with ``unembed``)."""
    from peft.tuners.lora.layer import LoraLayer

    head = model.get_output_embeddings()
    return isinstance(head, LoraLayer) and name in head.lora_A


def output_weight(causal_lm: Any) -> torch.Tensor:
    """The unembedding the logits use: the output layer's weight, plus the active LoRA adapter's ``B A * scaling``
    where that layer carries one (an adapter added with ``unembed``: the Tinker SDK's ``train_unembed``). The
    learner's logprobs read this, so they match the generator's logits, and the adapter's output-layer weights
    get their gradients through it. (LoRA dropout is not applied here: as in eval mode.)"""
    from peft.tuners.lora.layer import LoraLayer

    head: Any = causal_lm.get_output_embeddings()
    if not isinstance(head, LoraLayer) or head.disable_adapters or head.merged:
        return cast(torch.Tensor, head.weight)
    weight = cast(torch.Tensor, head.get_base_layer().weight)
    for name in head.active_adapters:
        if name in head.lora_A:
            a = cast(torch.Tensor, head.lora_A[name].weight)
            b = cast(torch.Tensor, head.lora_B[name].weight)
            weight = weight + (b @ a * head.scaling[name]).to(weight.dtype)
    return weight


def with_lora(causal_lm: Any, lora: LoraSettings, adapters: Sequence[str] = ()) -> Any:
    """``causal_lm`` wrapped by PEFT with LoRA adapters (the causal LM itself when ``lora`` is off). Without
    ``adapters``: one adapter, PEFT's ``default``. With them: one adapter per name, each from ``lora``'s settings,
    the first one active (``layouts/adapters.py`` serves and trains them side by side)."""
    if adapters:
        from peft import get_peft_model

        names = [check_adapter_name(a) for a in adapters]
        if len(set(names)) != len(names):
            raise ValueError(f"adapter names must be distinct (got {names})")
        peft_model = get_peft_model(causal_lm, lora_config(lora), adapter_name=names[0])
        for name in names[1:]:
            add_lora_adapter(peft_model, name, lora)
        return peft_model.eval()  # PEFT leaves it in training mode, where it refuses mixed-adapter batches
    if not lora.enabled:
        return causal_lm
    from peft import get_peft_model

    return get_peft_model(causal_lm, lora_config(lora)).eval()  # a learner's step switches to training mode


def add_lora_adapter(peft_model: Any, name: str, lora: LoraSettings, rank: int | None = None,
                     unembed: bool = False) -> None:
    """Add a fresh LoRA adapter (``lora``'s settings, its own ``rank`` when given; with ``unembed``, on the output
    layer too) beside the others; the active adapter stays as it was. On the thread that runs the module's
    forwards (a new adapter's layers appear)."""
    check_adapter_name(name)
    if name in peft_model.peft_config:
        raise ValueError(f"adapter {name!r} exists already (adapters: {sorted(peft_model.peft_config)})")
    active = peft_model.active_adapter
    extra = [output_layer_name(peft_model)] if unembed else []
    peft_model.add_adapter(name, lora_config(lora, rank, extra))
    peft_model.set_adapter(active)  # PEFT freezes every adapter but the active one


def adapter_parameters(peft_model: Any, name: str) -> list[torch.nn.Parameter]:
    """The parameters of adapter ``name`` alone (its ``lora_A`` / ``lora_B`` weights in every adapted layer),
    found by the adapter layers' own dictionaries rather than by matching parameter names."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    params: list[torch.nn.Parameter] = []
    for module in peft_model.modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        for attr in module.adapter_layer_names:
            table = getattr(module, attr)
            if name in table:
                part = table[name]
                params.extend(part.parameters() if isinstance(part, torch.nn.Module) else [part])
    if not params:
        raise ValueError(f"the model has no LoRA adapter {name!r}")
    return params


def load_policy_model(model: str | Path, placement: PlacementSettings | None = None,
                      learner: LearnerSettings | None = None, adapters: Sequence[str] = ()) -> PolicyModel:
    """The model named by ``model`` (a built-in name or a local directory), on ``placement``'s device and dtype,
    with the learner's LoRA adapters and gradient checkpointing. ``adapters``: one named LoRA adapter each (the
    learner's LoRA settings for all), on one frozen base; they need a LoRA rank."""
    from transformers import AutoModelForCausalLM

    settings = learner or LearnerSettings()
    if adapters and not settings.lora.enabled:
        raise ValueError(f"adapters {list(adapters)} need a LoRA rank (learner.lora.rank > 0): set --lora-rank N")
    path = resolve_model(str(model))
    placement = placement or PlacementSettings()
    device = resolve_device(placement.device)
    dtype = resolve_dtype(placement.dtype, device)
    facts = model_facts(path)
    causal_lm: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    causal_lm = causal_lm.to(device)
    causal_lm.eval()
    if settings.gradient_checkpointing:
        causal_lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return PolicyModel(facts=facts, causal_lm=causal_lm,
                       model=with_lora(causal_lm, settings.lora, adapters), device=device, dtype=dtype,
                       lora=settings.lora if settings.lora.enabled else None,
                       gradient_checkpointing=settings.gradient_checkpointing, adapters=tuple(adapters))
