"""AgentJet: decoupled swarm RL training for LLM agents."""

__version__ = "0.1.0"
