"""AgentJet: decoupled swarm RL training for LLM agents."""

import os

from agentjet.client import Episode, SwarmClient, SwarmError, SyncSwarmClient, Team


def _prefer_passive_openmp() -> None:
    """OpenMP worker threads that spin while waiting make CPU inference collapse when another process holds a
    core: on 2 cores with one busy, SmolLM2 decoding ran at 7 tok/s spinning vs 17 tok/s sleeping (2x at batch
    8). On an idle machine sleeping costs about 11 % of batch-8 throughput (docs/benchmarks.md); a server
    shares its CPU with clients, so sleeping is the default. libgomp reads this when torch loads it, so it is
    set on import, before torch (nothing above imports torch); a value already in the environment wins
    (``OMP_WAIT_POLICY=ACTIVE`` on a dedicated machine)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


_prefer_passive_openmp()

__version__ = "0.1.0"
__all__ = ["Episode", "SwarmClient", "SwarmError", "SyncSwarmClient", "Team", "__version__"]
