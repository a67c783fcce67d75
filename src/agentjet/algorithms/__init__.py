"""Advantage estimators and policy-gradient losses. Pure functions over tensors and floats."""

from agentjet.algorithms.advantages import AdvantageEstimator, compute_advantages
from agentjet.algorithms.loss import PolicyLossOutput, ppo_clip_loss

__all__ = ["AdvantageEstimator", "PolicyLossOutput", "compute_advantages", "ppo_clip_loss"]
