"""Engines own the weights: ``generate`` (dynamically batched) and ``train_step``."""

from agentjet.engines.base import Engine, FinishReason, GenerationResult, SamplingParams, TrainSample
from agentjet.engines.errors import EngineUnavailableError, GenerationError, TrainingHaltedError

__all__ = ["Engine", "EngineUnavailableError", "FinishReason", "GenerationError", "GenerationResult",
           "SamplingParams", "TrainSample", "TrainingHaltedError"]
