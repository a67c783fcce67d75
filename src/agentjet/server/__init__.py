"""The swarm server: OpenAI-compatible API, episode registry, durable store, batcher and trainer."""

from agentjet.server.swarm import SwarmServer

__all__ = ["SwarmServer"]
