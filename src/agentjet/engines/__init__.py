"""The roles (``Generator``, ``Learner``), their data types, model loading and the worker thread."""

from agentjet.engines.base import FinishReason, GenerationResult, SamplingParams, TrainSample
from agentjet.engines.errors import EngineUnavailableError, GenerationError, TrainingHaltedError

__all__ = ["EngineUnavailableError", "FinishReason", "GenerationError", "GenerationResult",
           "SamplingParams", "TrainSample", "TrainingHaltedError"]
