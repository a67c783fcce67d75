"""AgentJet: decoupled swarm RL training for LLM agents."""

from agentjet.client import Episode, SwarmClient, SwarmError, SyncSwarmClient, Team

__version__ = "0.1.0"  # the one place: pyproject reads it (dynamic version), `ajet --version` prints it
__all__ = ["Episode", "SwarmClient", "SwarmError", "SyncSwarmClient", "Team", "__version__"]
