"""AgentJet: decoupled swarm RL training for LLM agents."""

from agentjet.client import Episode, SwarmClient, SwarmError, SyncSwarmClient, Team
from agentjet.version import __version__

__all__ = ["Episode", "SwarmClient", "SwarmError", "SyncSwarmClient", "Team", "__version__"]
