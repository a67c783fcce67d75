"""The embedded generator the settings ask for, chosen once, when it is built: continuous batching
(``generator.batching: continuous``, the default) or static batching. A model the slot KV cache cannot serve
(sliding windows, other layer types) falls back to static batching with a warning, except with named LoRA
adapters, which need continuous batching and are refused, naming the setting."""

from __future__ import annotations

import logging

from agentjet.engines.model import PolicyModel
from agentjet.generators.hf.base import HFGenerator
from agentjet.generators.hf.continuous import ContinuousHFGenerator
from agentjet.generators.hf.kv_cache import slot_cache_fits
from agentjet.generators.hf.static import StaticHFGenerator
from agentjet.settings import GeneratorSettings

log = logging.getLogger(__name__)


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
