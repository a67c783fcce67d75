"""vLLM as the generator, with either learner: the in-process learner (``learner.group.procs`` 0) or a trainer
group. The weights reach vLLM after each step as safetensors and a reload, checked by the probe
(``generators/vllm/sync.py: VLLMReload``), or, with ``generator.vllm.weight_transfer: nccl`` and the in-process
learner, over NCCL through vLLM's weight-transfer API (``generators/vllm/native_sync.py``; unverified on a GPU:
docs/vllm.md). Several LoRA adapters on one vLLM: ``layouts/vllm_adapters.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentjet.distributed.learner import GroupLearner
from agentjet.engines.model import load_policy_model, model_facts
from agentjet.generators.vllm import VLLMGenerator, VLLMReload
from agentjet.generators.vllm.native_sync import ModuleTensors, native_sync
from agentjet.layouts.composed import ComposedEngine
from agentjet.layouts.group import start_trainer_group
from agentjet.learners.inprocess import InProcessLearner
from agentjet.models import resolve_model
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import ServerConfig
from agentjet.weights import io as weights


def vllm_engine(config: ServerConfig, work_dir: Path) -> ComposedEngine:
    """vLLM generates; the in-process learner (``learner.group.procs`` 0) or a learner group trains."""
    gen = config.generator
    if config.learner.group.procs:
        facts = model_facts(resolve_model(config.model))
        start_dir = weights.export_untied_copy(facts, weights.version_dir(work_dir / "weights", 0))
        learner: Any = GroupLearner(start_trainer_group(config), facts)
        lora = False
        policy = None  # the weights live in the trainer group's processes
    else:
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
        if policy is None:  # a trainer group: its weights are not in this process
            raise ValueError("generator.vllm.weight_transfer: nccl needs the in-process learner (learner.group.procs "
                             "0); a trainer group hands its weights over through files")

        seam = native_sync(generator.client, ModuleTensors(policy.causal_lm), gen.vllm, device=policy.device)
    return ComposedEngine(generator, learner, seam)
