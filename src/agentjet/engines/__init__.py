"""Engines own the weights: ``generate`` (dynamically batched) and ``train_step``."""

from agentjet.engines.base import (
    Engine,
    FinishReason,
    GenerationResult,
    SamplingParams,
    TrainConfig,
    TrainSample,
)

__all__ = ["Engine", "FinishReason", "GenerationResult", "SamplingParams", "TrainConfig", "TrainSample"]
