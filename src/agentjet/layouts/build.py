"""The settings to what the server serves, chosen here once: ``build_engine`` builds one policy's ``Engine`` (the
pair protocol of ``engines/base.py``), ``build_adapters`` the ``AdapterSet`` of several LoRA adapters on one base.
The server's entry point (``server/http/app.py: serve``) calls the one that ``ServerConfig.swarm_adapters`` asks for.

The model is resolved here once (a hub id to its cached snapshot at one commit), and that one local directory goes
to every part: the generator, vLLM and the trainer group. Device placement is checked before anything starts.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from agentjet.engines.base import AdapterSet, Engine
from agentjet.layouts.adapters import adapter_engines
from agentjet.layouts.embedded import embedded_engine
from agentjet.layouts.engine_process import engine_process_engine, uses_engine_process
from agentjet.layouts.fleet import fleet_engine
from agentjet.layouts.group import group_engine
from agentjet.layouts.null import NullAdapters, null_engine
from agentjet.layouts.placement import check_placement
from agentjet.layouts.vllm import vllm_engine
from agentjet.layouts.vllm_adapters import vllm_adapters
from agentjet.models import resolve_model
from agentjet.settings import EngineKind, ServerConfig


def _resolved(config: ServerConfig) -> ServerConfig:
    """The settings with the model resolved to its one local directory (and no revision left to resolve)."""
    model_dir = str(resolve_model(config.model, config.model_revision))
    return config.model_copy(update={"model": model_dir, "model_revision": None})


def _vllm_dir(config: ServerConfig) -> Path:
    return Path(config.data_dir or ".") / "vllm"


def build_engine(config: ServerConfig) -> Engine:
    """One policy's engine, as the ``generator``, ``learner`` and ``placement`` blocks (and the loss settings) ask:
    the null pair, a fleet of generator replicas with either learner, vLLM with either learner, or the embedded
    generator with a trainer group or in process. Settings that name LoRA adapters are refused: ``build_adapters``
    builds those."""
    if config.swarm_adapters():
        raise ValueError(f"the settings name LoRA adapters {config.swarm_adapters()}: build them with "
                         "build_adapters (one engine per adapter), not build_engine")
    config = _resolved(config)
    gen = config.generator
    if gen.kind is EngineKind.NULL:
        return null_engine(AutoTokenizer.from_pretrained(config.model), reply=gen.null_reply,
                           delay_s=gen.null_delay_ms / 1000)
    check_placement(config)
    if gen.is_fleet:
        return fleet_engine(config, Path(config.data_dir or "."))
    if gen.kind is EngineKind.VLLM:
        return vllm_engine(config, _vllm_dir(config))
    if config.learner.group.procs:
        return group_engine(config)
    if uses_engine_process(config):
        return engine_process_engine(config.model, gen, config.learner, config.loss, config.placement,
                                     log_dir=Path(config.data_dir) if config.data_dir else None)
    return embedded_engine(config.model, gen, config.learner, config.loss, config.placement)


def build_adapters(config: ServerConfig) -> AdapterSet:
    """One engine per name of the swarm's adapters (``ServerConfig.swarm_adapters``: ``learner.lora.adapters``, or
    the one a Tinker key asks for) on one frozen base: on the null pair, on one vLLM, or on the embedded generator
    (mixed-adapter batches)."""
    names = config.swarm_adapters()
    if not names:
        raise ValueError("build_adapters needs LoRA adapters (learner.lora.adapters); build_engine builds one policy")
    if config.generator.is_fleet:
        raise ValueError(f"LoRA adapters {names} on generator replicas are not built yet: the adapter layouts train "
                         "in place on one generator's module (or one vLLM's); use generator.replicas 1 "
                         "(--generator-replicas 1) with adapters or a Tinker key")
    config = _resolved(config)
    gen = config.generator
    if gen.kind is EngineKind.NULL:
        return NullAdapters(AutoTokenizer.from_pretrained(config.model), names, reply=gen.null_reply,
                            delay_s=gen.null_delay_ms / 1000)
    check_placement(config)
    if gen.kind is EngineKind.VLLM:
        return vllm_adapters(config, _vllm_dir(config))
    return adapter_engines(config.model, names, gen, config.learner, config.loss, config.placement)


def build_from_settings(config: ServerConfig) -> Engine | AdapterSet:
    """What the settings ask a server to drive: one engine per adapter when the swarm has LoRA adapters
    (``ServerConfig.swarm_adapters``), else one policy's engine. The one place this choice is made."""
    return build_adapters(config) if config.swarm_adapters() else build_engine(config)
