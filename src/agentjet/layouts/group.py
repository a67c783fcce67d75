"""The trainer group as the learner (FSDP2 ranks under torchrun, ``agentjet.distributed``), and the layout that
joins it to the embedded generator: each step's export (safetensors, in ``/dev/shm`` when it has room) is copied
into the generator's module in place (``generators/hf/sync.py: CopyIntoModule``), on its thread in this process
or in its engine process (``generator.engine_process``, ``layouts/engine_process.py``). vLLM with a trainer group:
``layouts/vllm.py``, which starts the group here too."""

from __future__ import annotations

from pathlib import Path

from agentjet.distributed.group import TrainerGroup
from agentjet.distributed.learner import GroupLearner
from agentjet.engines.model import load_policy_model
from agentjet.generators.hf.base import HFGenerator
from agentjet.generators.hf.build import hf_generator
from agentjet.generators.hf.engine_process import ProcessHFGenerator
from agentjet.generators.hf.sync import CopyIntoModule
from agentjet.layouts.composed import ComposedEngine
from agentjet.layouts.engine_process import process_generator, uses_engine_process
from agentjet.learners.policy_step import StepConfig
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import EngineKind, ServerConfig


def start_trainer_group(config: ServerConfig) -> TrainerGroup:
    """The learner group of ``learner.group``, started (its work directory under the data dir unless set)."""
    settings = config.learner.group
    if settings.work_dir is None and config.data_dir is not None:
        settings = settings.model_copy(update={"work_dir": Path(config.data_dir) / "trainer-group"})
    group = TrainerGroup(config.model, settings, StepConfig.from_settings(
        config.learner, config.loss, separate_sampler=config.generator.kind is EngineKind.VLLM))
    group.start()
    return group


def group_engine(config: ServerConfig) -> ComposedEngine:
    """The embedded generator with a trainer group: each step's export is copied into its module in place, in this
    process or in the generator's engine process (``generator.engine_process``)."""
    generator: HFGenerator | ProcessHFGenerator
    if uses_engine_process(config):
        generator = process_generator(Path(config.model), config.generator, config.placement,
                                      Path(config.data_dir) if config.data_dir else None)
        facts = generator.facts
    else:
        generator = hf_generator(load_policy_model(config.model, config.placement), config.generator)
        facts = generator.policy.facts
    try:
        learner = GroupLearner(start_trainer_group(config), facts)
        if isinstance(generator, ProcessHFGenerator):
            generator.wait_ready()
    except BaseException:
        run_blocking(generator.close())
        raise
    return ComposedEngine(generator, learner, CopyIntoModule(config.learner.group.push_timeout_s))
