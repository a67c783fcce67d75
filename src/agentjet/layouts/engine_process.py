"""The embedded generator in an engine process of its own beside the in-process learner
(``generator.engine_process``): two copies of the weights, one in each process, joined by the copy seam. After each
step the learner exports its weights as safetensors (in ``/dev/shm`` when it has room) and the engine process copies
them into its module in place, between decode steps (``generators/hf/sync.py: CopyIntoModule``); until it
confirms, the server serves the previous version, and rows in flight carry each token's version. The trainer group
takes the same engine process in ``group.py``.

Which layout runs is chosen once, in ``build.py`` (``generators/hf/build.py: engine_process_wanted``): the
single-process layout (``embedded.py``) shares one module and moves nothing."""

from __future__ import annotations

from pathlib import Path

from agentjet.engines.model import load_policy_model, model_facts, resolve_device
from agentjet.generators.hf.build import engine_process_wanted
from agentjet.generators.hf.engine_process import ProcessHFGenerator
from agentjet.generators.hf.sync import CopyIntoModule
from agentjet.layouts.composed import ComposedEngine
from agentjet.learners.inprocess import InProcessLearner
from agentjet.models import DEFAULT_MODEL, resolve_model
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import (
    EngineKind,
    GeneratorSettings,
    LearnerSettings,
    LossSettings,
    PlacementSettings,
    ServerConfig,
)
from agentjet.weights.shm import dir_bytes, shm_dir

SHM_OWNER = "engine"  # its weight exports in /dev/shm: agentjet-engine-weights-<pid>-<random>


def uses_engine_process(config: ServerConfig) -> bool:
    """Whether the settings (their model resolved to its directory) put one policy's embedded generator in an engine
    process (``generators/hf/build.py: engine_process_wanted``)."""
    if config.generator.kind is not EngineKind.HF:
        return False
    return engine_process_wanted(config.generator, resolve_device(config.placement.device),
                                 model_facts(config.model).config)


def process_generator(model: Path, generator: GeneratorSettings, placement: PlacementSettings | None,
                      log_dir: Path | None = None) -> ProcessHFGenerator:
    """The engine process for ``model``, started (it loads the model while the caller goes on; ``wait_ready``)."""
    log_path = Path(log_dir) / "engine-process.log" if log_dir is not None else None
    return ProcessHFGenerator(model_facts(model), generator, placement, log_path=log_path)


def engine_process_engine(model: str | Path = DEFAULT_MODEL, generator: GeneratorSettings | None = None,
                          learner: LearnerSettings | None = None, loss: LossSettings | None = None,
                          placement: PlacementSettings | None = None, log_dir: Path | None = None) -> ComposedEngine:
    """The embedded generator in its engine process and the in-process learner with its own copy of the weights.
    The engine process loads the model while this process loads the learner's copy."""
    path = resolve_model(str(model))
    gen = process_generator(path, generator or GeneratorSettings(), placement, log_dir)
    try:
        policy = load_policy_model(path, placement, learner)
        export_root = shm_dir(SHM_OWNER, "weights", 4 * dir_bytes(path))
        trainer = InProcessLearner(policy, learner or LearnerSettings(), loss or LossSettings(),
                                   export_root=export_root, owns_export_root=export_root is not None)
        gen.wait_ready()
    except BaseException:
        run_blocking(gen.close())
        raise
    return ComposedEngine(gen, trainer, CopyIntoModule(gen.settings.process.control_timeout_s))
