"""The embedded generator the settings ask for, chosen once, when it is built: continuous batching
(``generator.batching: continuous``, the default) or static batching, on a thread of this process
(``hf_generator``) or in an engine process of its own (``engine_process_wanted``; the layouts build it:
``layouts/engine_process.py``). A model the slot KV cache cannot serve (sliding windows, other layer types) falls
back to static batching with a warning, except with named LoRA adapters, which need continuous batching and are
refused, naming the setting."""

from __future__ import annotations

import logging
from typing import Any

import torch

from agentjet.engines.model import PolicyModel
from agentjet.generators.hf.base import HFGenerator
from agentjet.generators.hf.continuous import ContinuousHFGenerator
from agentjet.generators.hf.kv_cache import slot_cache_fits
from agentjet.generators.hf.static import StaticHFGenerator
from agentjet.settings import GeneratorSettings

log = logging.getLogger(__name__)

# ``generator.engine_process: auto`` by device type: whichever layout measured faster there (docs/benchmarks.md,
# "The engine process"; the GPU figure is to be confirmed by the GPU round).
ENGINE_PROCESS_BY_DEVICE = {"cpu": False, "cuda": True}


def hf_generator(policy: PolicyModel, settings: GeneratorSettings | None = None) -> HFGenerator:
    """``ContinuousHFGenerator`` or ``StaticHFGenerator`` over ``policy``, as ``settings.batching`` says."""
    settings = settings or GeneratorSettings()
    if settings.batching == "static":
        return StaticHFGenerator(policy, settings)  # it refuses named adapters
    unfit = slot_cache_fits(policy.causal_lm.config)
    if unfit is not None and not policy.adapters:
        log.warning("continuous batching does not support %s; using static batching", unfit)
        return StaticHFGenerator(policy, settings)
    return ContinuousHFGenerator(policy, settings)  # it refuses adapters on a model the slot cache cannot serve


def engine_process_wanted(settings: GeneratorSettings, device: torch.device, model_config: Any) -> bool:
    """Whether one policy's embedded generator runs in an engine process: ``generator.engine_process`` on, off, or
    auto (``ENGINE_PROCESS_BY_DEVICE``). Static batching, and a model the slot cache cannot serve (which falls
    back to it), stay in process: ``on`` with them is refused. (Named LoRA adapters always stay in process: the
    settings refuse ``on`` with them, and their layout never asks.)"""
    unfit = slot_cache_fits(model_config)
    if settings.engine_process == "off":
        return False
    if settings.engine_process == "on":
        if settings.batching == "static" or unfit is not None:
            why = "generator.batching is 'static'" if unfit is None else f"the model has {unfit}"
            raise ValueError(f"generator.engine_process on serves continuous batching, but {why}: static batching "
                             "runs in process (--engine-process auto or off)")
        return True
    return ENGINE_PROCESS_BY_DEVICE.get(device.type, False) and settings.batching == "continuous" and unfit is None
