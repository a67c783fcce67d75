"""Episode-level advantage estimators over a group of episodes that share a task id."""

from __future__ import annotations

import enum
import math


class AdvantageEstimator(enum.StrEnum):
    GRPO = "grpo"  # (r - mean) / (std + eps)
    RLOO = "rloo"  # r - mean of the others
    REINFORCE = "reinforce"  # r - baseline (group mean), no scaling


def compute_advantages(
    rewards: list[float], estimator: AdvantageEstimator = AdvantageEstimator.GRPO, eps: float = 1e-6,
    scale_by_std: bool = True,
) -> list[float]:
    """One advantage per episode in the group. ``scale_by_std=False`` drops GRPO's division by the group's
    std (Dr. GRPO, Liu et al., 2025: the std favours groups whose rewards barely differ); the other
    estimators never scale."""
    n = len(rewards)
    if n == 0:
        return []
    if any(not math.isfinite(r) for r in rewards):
        raise ValueError("rewards must be finite numbers")
    mean = sum(rewards) / n
    if estimator is AdvantageEstimator.GRPO and scale_by_std:
        if n == 1:
            return [0.0]
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))
        return [(r - mean) / (std + eps) for r in rewards]
    if estimator is AdvantageEstimator.RLOO:
        if n == 1:
            return [0.0]
        total = sum(rewards)
        return [r - (total - r) / (n - 1) for r in rewards]
    return [r - mean for r in rewards]
