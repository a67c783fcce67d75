"""Engines own the weights: ``generate`` (dynamically batched) and ``train_step``."""

from agentjet.engines.base import (
    Engine,
    EngineUnavailable,
    FinishReason,
    GenerationError,
    GenerationResult,
    SamplingParams,
    TrainSample,
)

__all__ = ["Engine", "EngineUnavailable", "FinishReason", "GenerationError", "GenerationResult", "SamplingParams",
           "TrainSample"]
