"""The layouts a server runs: one generator composed with one learner and the seam that joins them.

| generator | learner            | seam (weight transport)                       | built by                 |
|-----------|--------------------|-----------------------------------------------|--------------------------|
| embedded  | in process         | in place (one shared module)                  | :func:`embedded_engine`  |
| embedded  | trainer group      | safetensors (``/dev/shm``) copied in place    | :func:`build_engine`     |
| vLLM      | in process         | safetensors + vLLM reload (+ probe)           | :func:`build_engine`     |
| vLLM      | trainer group      | safetensors + vLLM reload (+ probe)           | :func:`build_engine`     |

(NCCL through vLLM's weight-transfer API is the fast path for the vLLM rows on GPUs: ``engines/vllm/native_sync``.)
Device placement is checked before anything starts (:func:`check_placement`).

One base with several named LoRA adapters, one engine per adapter on one shared embedded generator:
``layouts/adapters.py`` (``adapter_engines``); on one shared vLLM: ``layouts/vllm_adapters.py`` (``vllm_adapters``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentjet.layouts.composed import ComposedEngine
from agentjet.models import DEFAULT_MODEL
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import (
    EngineKind,
    GeneratorSettings,
    LearnerSettings,
    LossSettings,
    PlacementSettings,
    ServerConfig,
)
from agentjet.weights.sync import InPlace

if TYPE_CHECKING:
    from agentjet.layouts.adapters import AdapterEngines
    from agentjet.layouts.null import NullAdapters
    from agentjet.layouts.vllm_adapters import VLLMAdapters


class PlacementError(ValueError):
    """The generator and the learner were placed on the same GPUs without being asked to share them."""


def _ids(text: str | None) -> list[int] | None:
    return [int(x) for x in text.split(",") if x.strip()] if text else None


def _gpus(config: ServerConfig, gpu_count: int, environ: Mapping[str, str]) -> tuple[set[int], set[int], str, str]:
    """(rollout GPUs, learner GPUs, how each was decided), as physical ids; an empty set is the CPU."""
    inherited = _ids(environ.get("CUDA_VISIBLE_DEVICES")) or list(range(gpu_count))
    gen, placement = config.generator, config.placement

    def embedded(device: str) -> tuple[set[int], str]:
        if device == "cpu" or (device == "auto" and gpu_count == 0):
            return set(), "the CPU"
        index = int(device.split(":")[1]) if ":" in device else 0
        return {inherited[index] if index < len(inherited) else index}, f"placement.device {device!r}"

    if gen.kind is EngineKind.VLLM:
        v = gen.vllm
        if v.platform == "cpu":
            rollout, why_r = set(), "the CPU"
        else:
            own = _ids(v.cuda_visible_devices) or _ids(v.extra_env.get("CUDA_VISIBLE_DEVICES"))
            rollout = set(own or inherited)
            why_r = (f"generator.vllm.cuda_visible_devices {v.cuda_visible_devices!r}" if v.cuda_visible_devices
                     else "every GPU the server sees (generator.vllm.cuda_visible_devices unset)")
    else:
        rollout, why_r = embedded(placement.device)
    t = config.learner.group
    if not t.procs:
        learner, why_l = embedded(placement.device)
        why_l = f"the in-process learner on {why_l}"
    elif t.device == "cpu" or (t.device == "auto" and gpu_count == 0):
        learner, why_l = set(), "the CPU"
    else:
        own = _ids(t.cuda_visible_devices)
        learner = set((own or inherited)[: t.procs])
        why_l = (f"learner.group.cuda_visible_devices {t.cuda_visible_devices!r}" if own else
                 f"the first {t.procs} GPU(s) the server sees (learner.group.cuda_visible_devices unset)")
    return rollout, learner, why_r, why_l


def check_placement(config: ServerConfig, gpu_count: int | None = None,
                    environ: Mapping[str, str] | None = None) -> None:
    """The rollout GPUs and the learner's must not overlap unless ``placement.colocate`` asks for it. CPU layouts
    share the CPU and are exempt; so is the single-process layout, whose learner shares the generator's module."""
    kind = config.generator.kind
    if kind is EngineKind.NULL or (kind is EngineKind.HF and not config.learner.group.procs):
        return
    if gpu_count is None:
        import torch

        gpu_count = torch.cuda.device_count()
    rollout, learner, why_r, why_l = _gpus(config, gpu_count, os.environ if environ is None else environ)
    both = sorted(rollout & learner)
    if both and not config.placement.colocate:
        raise PlacementError(
            f"the rollout engine ({kind.value}) uses GPU(s) {sorted(rollout)} ({why_r}) and the "
            f"learner uses GPU(s) {sorted(learner)} ({why_l}): they overlap on {both}. Give each its own "
            "(--vllm-cuda-visible-devices / --learner-devices), or share them on purpose with --colocate")


# ---------------------------------------------------------------- the four pairs
def embedded_engine(model: str | Path = DEFAULT_MODEL, generator: GeneratorSettings | None = None,
                    learner: LearnerSettings | None = None, loss: LossSettings | None = None,
                    placement: PlacementSettings | None = None) -> ComposedEngine:
    """The single-process layout: the embedded generator and the in-process learner share one module."""
    from agentjet.generators.hf import HFGenerator, load_policy_model
    from agentjet.learners.inprocess import InProcessLearner

    learner = learner or LearnerSettings()
    policy = load_policy_model(model, placement, learner)
    gen = HFGenerator(policy, generator)
    # the version moves in the same worker job as the step: a request queued during the step carries the new one
    trainer = InProcessLearner(policy, learner, loss or LossSettings(), worker=gen.worker,
                               on_version=lambda v: setattr(gen, "policy_version", v))
    return ComposedEngine(gen, trainer, InPlace())


def _group(config: ServerConfig) -> Any:
    from agentjet.distributed.group import TrainerGroup
    from agentjet.learners.policy_step import StepConfig

    settings = config.learner.group
    if settings.work_dir is None and config.data_dir is not None:
        settings = settings.model_copy(update={"work_dir": Path(config.data_dir) / "trainer-group"})
    group = TrainerGroup(config.model, settings, StepConfig.from_settings(
        config.learner, config.loss, separate_sampler=config.generator.kind is EngineKind.VLLM))
    group.start()
    return group


def vllm_engine(config: ServerConfig, work_dir: Path) -> ComposedEngine:
    """vLLM generates; the in-process learner (``learner.group.procs`` 0) or a learner group trains."""
    from agentjet.generators.vllm import VLLMGenerator, VLLMReload
    from agentjet.weights import io as weights

    gen = config.generator
    if config.learner.group.procs:
        from agentjet.distributed.learner import GroupLearner
        from agentjet.engines.model import model_facts
        from agentjet.models import resolve_model

        facts = model_facts(resolve_model(config.model))
        start_dir = weights.export_untied_copy(facts, weights.version_dir(work_dir / "weights", 0))
        learner: Any = GroupLearner(_group(config), facts)
        lora = False
        policy = None  # the weights live in the trainer group's processes
    else:
        from agentjet.engines.model import load_policy_model
        from agentjet.learners.inprocess import InProcessLearner

        policy = load_policy_model(config.model, config.placement, config.learner)
        learner = InProcessLearner(policy, config.learner, config.loss, separate_sampler=True, export_root=work_dir,
                                   keep_exports=gen.vllm.keep_weight_versions)
        facts = policy.facts
        lora = policy.lora is not None
        dtype = gen.vllm.dtype if gen.vllm.dtype != "auto" else None
        start_dir = policy.path if lora else run_blocking(learner.export_weights(dtype))
    context = facts.context_length
    generator = VLLMGenerator(start_dir, facts.tokenizer, gen.vllm, stop_ids=set(facts.stop_ids),
                              max_context=min(gen.max_context or context, context), seed=gen.seed,
                              lora_adapters=lora, work_dir=work_dir)
    seam: Any = VLLMReload(gen.vllm)
    if gen.vllm.weight_transfer == "nccl":  # unverified on a GPU: docs/vllm.md
        from agentjet.generators.vllm.native_sync import ModuleTensors, native_sync

        if policy is None:  # a trainer group: its weights are not in this process
            raise ValueError("generator.vllm.weight_transfer: nccl needs the in-process learner (learner.group.procs "
                             "0); a trainer group hands its weights over through files")

        seam = native_sync(generator.client, ModuleTensors(policy.causal_lm), gen.vllm, device=policy.device)
    return ComposedEngine(generator, learner, seam)


def group_engine(config: ServerConfig) -> ComposedEngine:
    """The embedded generator with a trainer group: each step's export is copied into its module in place."""
    from agentjet.distributed.learner import GroupLearner
    from agentjet.generators.hf import HFGenerator
    from agentjet.generators.hf.sync import CopyIntoModule

    generator = HFGenerator.load(config.model, config.generator, config.placement)
    learner = GroupLearner(_group(config), generator.policy.facts)
    return ComposedEngine(generator, learner, CopyIntoModule(config.learner.group.push_timeout_s))


def build_engine(config: ServerConfig) -> ComposedEngine | AdapterEngines | VLLMAdapters | NullAdapters:
    """The engine the settings ask for: the ``generator``, ``learner`` and ``placement`` blocks (and the loss
    settings) go to it. The model
    is resolved here once (a hub id to its cached snapshot at one commit), and that one local directory goes to
    every part: the generator, vLLM and the trainer group."""
    from agentjet.models import resolve_model

    model_dir = str(resolve_model(config.model, config.model_revision))
    config = config.model_copy(update={"model": model_dir, "model_revision": None})
    adapters = config.swarm_adapters()  # learner.lora.adapters, or the one a Tinker key asks for
    if config.generator.kind is EngineKind.NULL:
        from transformers import AutoTokenizer

        from agentjet.layouts.null import NullAdapters, null_engine

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if adapters:
            return NullAdapters(tokenizer, list(adapters), reply=config.generator.null_reply,
                                delay_s=config.generator.null_delay_ms / 1000)
        return null_engine(tokenizer, reply=config.generator.null_reply, delay_s=config.generator.null_delay_ms / 1000)
    check_placement(config)
    if adapters and config.generator.kind is EngineKind.VLLM:
        from agentjet.layouts.vllm_adapters import vllm_adapters

        return vllm_adapters(config, Path(config.data_dir or ".") / "vllm")
    if adapters:
        from agentjet.layouts.adapters import adapter_engines

        return adapter_engines(config.model, list(adapters), config.generator, config.learner, config.loss,
                               config.placement)
    if config.generator.kind is EngineKind.VLLM:
        return vllm_engine(config, Path(config.data_dir or ".") / "vllm")
    if config.learner.group.procs:
        return group_engine(config)
    return embedded_engine(config.model, config.generator, config.learner, config.loss, config.placement)
