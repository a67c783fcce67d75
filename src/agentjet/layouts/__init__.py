"""The layouts a server runs: one generator composed with one learner and the seam that joins them.

| generator | learner            | seam (weight transport)                       | built by                 |
|-----------|--------------------|-----------------------------------------------|--------------------------|
| embedded  | in process         | in place (one shared module)                  | :func:`embedded_engine`  |
| embedded  | trainer group      | safetensors (``/dev/shm``) copied in place    | :func:`build_engine`     |
| vLLM      | in process         | safetensors + vLLM reload (+ probe)           | :func:`build_engine`     |
| vLLM      | trainer group      | safetensors + vLLM reload (+ probe)           | :func:`build_engine`     |

(NCCL through vLLM's weight-transfer API is the fast path for the vLLM rows on GPUs: ``engines/vllm/native_sync``.)
Device placement is checked before anything starts (:func:`check_placement`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentjet.layouts.composed import ComposedEngine
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import EngineKind, EngineSettings, LossSettings, ServerConfig
from agentjet.weights.sync import InPlace


class PlacementError(ValueError):
    """The generator and the learner were placed on the same GPUs without being asked to share them."""


def _ids(text: str | None) -> list[int] | None:
    return [int(x) for x in text.split(",") if x.strip()] if text else None


def _gpus(config: ServerConfig, gpu_count: int, environ: Mapping[str, str]) -> tuple[set[int], set[int], str, str]:
    """(rollout GPUs, learner GPUs, how each was decided), as physical ids; an empty set is the CPU."""
    inherited = _ids(environ.get("CUDA_VISIBLE_DEVICES")) or list(range(gpu_count))
    engine = config.engine

    def embedded(device: str) -> tuple[set[int], str]:
        if device == "cpu" or (device == "auto" and gpu_count == 0):
            return set(), "the CPU"
        index = int(device.split(":")[1]) if ":" in device else 0
        return {inherited[index] if index < len(inherited) else index}, f"engine.device {device!r}"

    if engine.kind is EngineKind.VLLM:
        v = engine.vllm
        if v.platform == "cpu":
            rollout, why_r = set(), "the CPU"
        else:
            own = _ids(v.cuda_visible_devices) or _ids(v.extra_env.get("CUDA_VISIBLE_DEVICES"))
            rollout = set(own or inherited)
            why_r = (f"engine.vllm.cuda_visible_devices {v.cuda_visible_devices!r}" if v.cuda_visible_devices
                     else "every GPU the server sees (engine.vllm.cuda_visible_devices unset)")
    else:
        rollout, why_r = embedded(engine.device)
    t = config.trainer
    if not t.procs:
        learner, why_l = embedded(engine.device)
        why_l = f"the in-process learner on {why_l}"
    elif t.device == "cpu" or (t.device == "auto" and gpu_count == 0):
        learner, why_l = set(), "the CPU"
    else:
        own = _ids(t.cuda_visible_devices)
        learner = set((own or inherited)[: t.procs])
        why_l = (f"trainer.cuda_visible_devices {t.cuda_visible_devices!r}" if own else
                 f"the first {t.procs} GPU(s) the server sees (trainer.cuda_visible_devices unset)")
    return rollout, learner, why_r, why_l


def check_placement(config: ServerConfig, gpu_count: int | None = None,
                    environ: Mapping[str, str] | None = None) -> None:
    """The rollout GPUs and the learner's must not overlap unless ``engine.colocate`` asks for it. CPU layouts
    share the CPU and are exempt; so is the single-process layout, whose learner shares the generator's module."""
    if config.engine.kind is EngineKind.NULL or (config.engine.kind is EngineKind.HF and not config.trainer.procs):
        return
    if gpu_count is None:
        import torch

        gpu_count = torch.cuda.device_count()
    rollout, learner, why_r, why_l = _gpus(config, gpu_count, os.environ if environ is None else environ)
    both = sorted(rollout & learner)
    if both and not config.engine.colocate:
        raise PlacementError(
            f"the rollout engine ({config.engine.kind.value}) uses GPU(s) {sorted(rollout)} ({why_r}) and the "
            f"learner uses GPU(s) {sorted(learner)} ({why_l}): they overlap on {both}. Give each its own "
            "(--vllm-cuda-visible-devices / --train-devices), or share them on purpose with --colocate")


# ---------------------------------------------------------------- the four pairs
def embedded_engine(model: str | Path = "smollm2-135m-instruct", settings: EngineSettings | None = None,
                    loss: LossSettings | None = None, learning_rate: float = 1e-5) -> ComposedEngine:
    """The single-process layout: the embedded generator and the in-process learner share one module."""
    from agentjet.generators.hf import HFGenerator, load_policy_model
    from agentjet.learners.inprocess import InProcessLearner

    settings = settings or EngineSettings()
    policy = load_policy_model(model, settings)
    generator = HFGenerator(policy, settings)
    # the version moves in the same worker job as the step: a request queued during the step carries the new one
    learner = InProcessLearner(policy, settings, loss or LossSettings(), learning_rate, worker=generator.worker,
                               on_version=lambda v: setattr(generator, "policy_version", v))
    return ComposedEngine(generator, learner, InPlace())


def _group(config: ServerConfig) -> Any:
    from agentjet.distributed.group import TrainerGroup
    from agentjet.learners.policy_step import StepConfig

    settings = config.trainer
    if settings.work_dir is None and config.data_dir is not None:
        settings = settings.model_copy(update={"work_dir": Path(config.data_dir) / "trainer-group"})
    group = TrainerGroup(config.model, settings,
                         StepConfig.from_settings(config.engine, config.loss, config.training.learning_rate))
    group.start()
    return group


def vllm_engine(config: ServerConfig, work_dir: Path) -> ComposedEngine:
    """vLLM generates; the in-process learner (``trainer.procs`` 0) or a trainer group trains."""
    from agentjet.generators.vllm import VLLMGenerator, VLLMReload
    from agentjet.weights import io as weights

    engine = config.engine
    if config.trainer.procs:
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        from agentjet.distributed.learner import GroupLearner
        from agentjet.engines.model import model_stop_ids
        from agentjet.models import resolve_model

        source = resolve_model(config.model)
        tokenizer = AutoTokenizer.from_pretrained(source)
        gen_config = GenerationConfig.from_pretrained(source) if (source / "generation_config.json").exists() \
            else None
        stop_ids = model_stop_ids(gen_config, tokenizer)
        context = int(getattr(AutoConfig.from_pretrained(source), "max_position_embeddings", 4096))
        start_dir = weights.export_untied_copy(source, weights.version_dir(work_dir / "weights", 0), tokenizer)
        learner: Any = GroupLearner(_group(config), tokenizer)
        lora = False
    else:
        from agentjet.engines.model import load_policy_model
        from agentjet.learners.inprocess import InProcessLearner

        policy = load_policy_model(config.model, engine)
        learner = InProcessLearner(policy, engine, config.loss, config.training.learning_rate, export_root=work_dir,
                                   keep_exports=engine.vllm.keep_weight_versions)
        tokenizer, stop_ids, context = policy.tokenizer, policy.stop_ids(), policy.context_length
        lora = policy.lora is not None
        dtype = engine.vllm.dtype if engine.vllm.dtype != "auto" else None
        start_dir = policy.path if lora else run_blocking(learner.export_weights(dtype))
    generator = VLLMGenerator(start_dir, tokenizer, engine.vllm, stop_ids=stop_ids,
                              max_context=min(engine.max_context or context, context), seed=engine.seed,
                              lora_adapters=lora, work_dir=work_dir)
    seam: Any = VLLMReload(engine.vllm)
    if engine.vllm.weight_transfer == "nccl":  # unverified on a GPU: docs/vllm.md
        from agentjet.generators.vllm.native_sync import ModuleTensors, native_sync

        seam = native_sync(generator.client, ModuleTensors(policy.causal_lm), engine.vllm, device=policy.device)
    return ComposedEngine(generator, learner, seam)


def group_engine(config: ServerConfig) -> ComposedEngine:
    """The embedded generator with a trainer group: each step's export is copied into its module in place."""
    from agentjet.distributed.learner import GroupLearner
    from agentjet.generators.hf import HFGenerator
    from agentjet.generators.hf.sync import CopyIntoModule

    generator = HFGenerator.load(config.model, config.engine)
    learner = GroupLearner(_group(config), generator.tokenizer)
    return ComposedEngine(generator, learner, CopyIntoModule(config.trainer.push_timeout_s))


def build_engine(config: ServerConfig) -> ComposedEngine:
    """The engine the settings ask for; the whole ``engine`` block (and the loss settings) goes to it. The model
    is resolved here once (a hub id to its cached snapshot at one commit), and that one local directory goes to
    every part: the generator, vLLM and the trainer group."""
    from agentjet.models import resolve_model

    model_dir = str(resolve_model(config.model, config.model_revision))
    config = config.model_copy(update={"model": model_dir, "model_revision": None})
    if config.engine.kind is EngineKind.NULL:
        from transformers import AutoTokenizer

        from agentjet.layouts.null import null_engine

        return null_engine(AutoTokenizer.from_pretrained(model_dir), reply=config.engine.null_reply,
                           delay_s=config.engine.null_delay_ms / 1000)
    check_placement(config)
    if config.engine.kind is EngineKind.VLLM:
        return vllm_engine(config, Path(config.data_dir or ".") / "vllm")
    if config.trainer.procs:
        return group_engine(config)
    return embedded_engine(config.model, config.engine, config.loss, config.training.learning_rate)
