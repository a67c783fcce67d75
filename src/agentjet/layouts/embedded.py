"""The single-process layout: the embedded generator and the in-process learner share one module, joined by the
in-place seam (nothing moves: the learner's step runs on the generator's worker thread, between decode steps)."""

from __future__ import annotations

from pathlib import Path

from agentjet.engines.model import load_policy_model
from agentjet.generators.hf.build import hf_generator
from agentjet.layouts.composed import ComposedEngine
from agentjet.learners.inprocess import InProcessLearner
from agentjet.models import DEFAULT_MODEL
from agentjet.settings import GeneratorSettings, LearnerSettings, LossSettings, PlacementSettings
from agentjet.weights.sync import InPlace


def embedded_engine(model: str | Path = DEFAULT_MODEL, generator: GeneratorSettings | None = None,
                    learner: LearnerSettings | None = None, loss: LossSettings | None = None,
                    placement: PlacementSettings | None = None) -> ComposedEngine:
    """The single-process layout: the embedded generator and the in-process learner share one module."""
    learner = learner or LearnerSettings()
    policy = load_policy_model(model, placement, learner)
    gen = hf_generator(policy, generator)
    # the version moves in the same worker job as the step: a request queued during the step carries the new one
    trainer = InProcessLearner(policy, learner, loss or LossSettings(), worker=gen.worker,
                               on_version=lambda v: setattr(gen, "policy_version", v))
    return ComposedEngine(gen, trainer, InPlace())
