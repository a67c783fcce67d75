"""The swarm client: episodes over HTTP, and a runner that drives a workflow over a dataset."""

from agentjet.client.client import Episode, SwarmClient, SwarmError
from agentjet.client.sync import SyncEpisode, SyncSwarmClient
from agentjet.client.team import Team, TeamEpisode

__all__ = ["Episode", "SwarmClient", "SwarmError", "SyncEpisode", "SyncSwarmClient", "Team", "TeamEpisode"]
