"""The swarm server: OpenAI-compatible API, episode registry, durable store, batcher and trainer."""

from agentjet.server.config import SamplingDefaults, ServerConfig, TrainingSettings
from agentjet.server.core import SwarmServer

__all__ = ["SamplingDefaults", "ServerConfig", "SwarmServer", "TrainingSettings"]
