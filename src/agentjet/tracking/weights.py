"""Loss weights for the samples of one episode.

The engine's loss is a weighted token mean over the batch: ``sum_s w_s * sum_t loss_t / sum_s w_s * n_s`` where
``n_s`` is the number of trained tokens of sample ``s``. Only the ratios of the weights inside a batch matter.

``per_episode`` (default): every sample of an episode gets ``w = 1 / N`` where ``N`` is the episode's number of
trained tokens (all its samples together). Each episode then has total weight 1, spread uniformly over its
trained tokens: the loss is the mean over episodes of each episode's token-mean loss. Why this default:

- an episode counts once whether it yields 1 sample or k (merging on, off, or blocked by forks);
- inside an episode every generated token has the same weight, so splitting an episode differently never
  changes the gradient: with merging on or off the batch loss and gradient are identical (merging never drops
  or duplicates a generated token and, at the token compare level, never changes a token's context);
- ``1/k`` per sample (``per_sample``) would not have that property under a token-mean loss: an episode would
  weigh ``N/k``, so the same episode counts 8x less when its 8 calls could not be merged than when they were.

``none``: ``w = 1`` (plain token mean over the batch: long episodes weigh more).
``per_sample``: ``w = 1/k`` for an episode of ``k`` samples (each episode sums to weight 1 in sample units; for
losses that average per sample first).
"""

from __future__ import annotations

from collections.abc import Sequence

from agentjet.tracking.types import EpisodeSample


def episode_weights(samples: Sequence[EpisodeSample], mode: str = "per_episode") -> list[float]:
    """Weights for the samples of ONE episode (see the module docstring for the modes)."""
    if not samples:
        return []
    if mode == "none":
        return [1.0] * len(samples)
    if mode == "per_sample":
        return [1.0 / len(samples)] * len(samples)
    if mode == "per_episode":
        total = sum(sum(s.loss_mask) for s in samples)
        if total <= 0:
            return [1.0 / len(samples)] * len(samples)
        return [1.0 / total] * len(samples)
    raise ValueError(f"unknown weighting mode {mode!r}: use 'per_episode', 'none' or 'per_sample'")


__all__ = ["episode_weights"]
