"""Advantage estimators and policy-gradient losses. Pure functions over floats (``advantages``) and tensors
(``loss``; import it from ``agentjet.algorithms.loss``, so that importing this package does not load torch)."""

from agentjet.algorithms.advantages import AdvantageEstimator, compute_advantages

__all__ = ["AdvantageEstimator", "compute_advantages"]
