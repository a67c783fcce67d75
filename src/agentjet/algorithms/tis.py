"""Trainer/sampler mismatch: truncated (TIS) and masked (MIS) importance-sampling weights, and statistics.

When a separate inference engine samples the rollouts, its logprobs (behaviour, ``p_s``) differ from what
the trainer computes for the same tokens (``p_t``): other kernels, other precision, and policy versions
that moved on while an episode ran. The trainer recomputes ``p_t`` and uses it as the proximal policy of
the PPO ratio; each token's loss is weighted by ``min(p_t / p_s, cap)`` (Yao et al., 2025, "Your efficient
RL framework secretly brings you off-policy RL training"), detached, so that a token the sampler made more
likely than the trainer would is not over-trained and no weight explodes. Masked IS keeps the weight where it
lies in ``[low, high]`` and drops the token (weight 0) elsewhere; at sequence level the weight is the geometric
mean of the sequence's token weights and the whole sequence is kept or dropped ("icepop"; TRL, prime-rl).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentjet.algorithms.objectives import Correction
from agentjet.algorithms.sequences import sequence_mean


def mismatch_kl_terms(trainer_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor) -> torch.Tensor:
    """Per token, the k3 estimate of KL(p_s || p_t) on tokens drawn from p_s (>= 0)."""
    log_r = trainer_logprobs - behaviour_logprobs
    return torch.exp(log_r.clamp(max=20.0)) - log_r - 1.0


@dataclass(frozen=True)
class CorrectionWeights:
    weights: torch.Tensor  # per token, detached; 0 where masked
    kept: torch.Tensor  # per token, bool: False where the mask dropped it


def correction_weights(proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                       seq_index: torch.Tensor | None, mode: Correction, low: float, high: float
                       ) -> CorrectionWeights:
    """The detached per-token weight of ``mode`` on ``w = p_proximal / p_behaviour`` (see ``Correction``)."""
    log_w = (proximal_logprobs - behaviour_logprobs).detach()
    if mode.per_sequence:
        if seq_index is None:
            raise ValueError(f"correction {mode.value} needs seq_index")
        log_w = sequence_mean(log_w, seq_index)
    w = torch.exp(log_w.clamp(max=20.0))
    if mode is Correction.NONE:
        return CorrectionWeights(torch.ones_like(w), torch.ones_like(w, dtype=torch.bool))
    if mode in (Correction.TIS, Correction.TIS_SEQUENCE):
        return CorrectionWeights(w.clamp(max=high), torch.ones_like(w, dtype=torch.bool))
    kept = (w >= low) & (w <= high)
    return CorrectionWeights(torch.where(kept, w, torch.zeros_like(w)), kept)
