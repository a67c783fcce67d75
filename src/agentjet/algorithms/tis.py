"""Trainer/sampler mismatch: truncated importance sampling (TIS) weights and mismatch statistics.

When a separate inference engine samples the rollouts, its logprobs (behaviour, ``p_s``) differ from what
the trainer computes for the same tokens (``p_t``): other kernels, other precision, and policy versions
that moved on while an episode ran. The trainer recomputes ``p_t`` and uses it as the proximal policy of
the PPO ratio; each token's loss is weighted by ``min(p_t / p_s, cap)`` (Yao et al., 2025, "Your efficient
RL framework secretly brings you off-policy RL training"), detached, so that a token the sampler made more
likely than the trainer would is not over-trained and no weight explodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MismatchStats:
    tokens: int
    kl: float  # KL(p_s || p_t) per token, k3 estimator on tokens drawn from p_s (>= 0)
    k1: float  # mean log p_s - log p_t (unbiased KL estimate, can be negative on few tokens)
    abs_diff: float  # mean |log p_t - log p_s|
    weight_mean: float  # mean TIS weight (1.0 when no cap is applied)
    truncated_frac: float  # share of tokens whose weight hit the cap

    def as_metrics(self) -> dict[str, float]:
        return {"mismatch_kl": self.kl, "mismatch_k1": self.k1, "mismatch_abs_diff": self.abs_diff,
                "tis_weight_mean": self.weight_mean, "tis_truncated_frac": self.truncated_frac,
                "mismatch_tokens": float(self.tokens)}


def tis_weights(trainer_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """Per-token ``min(p_t / p_s, cap)``; inputs are flat logprobs of the same tokens."""
    if cap <= 0:
        raise ValueError("the TIS cap must be > 0")
    return torch.exp((trainer_logprobs - behaviour_logprobs).clamp(max=20.0)).clamp(max=cap)


def mismatch_stats(trainer_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                   cap: float | None) -> MismatchStats:
    n = int(trainer_logprobs.numel())
    if n == 0:
        return MismatchStats(0, 0.0, 0.0, 0.0, 1.0, 0.0)
    log_r = (trainer_logprobs - behaviour_logprobs).double()
    k3 = torch.exp(log_r.clamp(max=20.0)) - log_r - 1.0
    if cap is None:
        weight_mean, truncated = 1.0, 0.0
    else:
        w = tis_weights(trainer_logprobs.double(), behaviour_logprobs.double(), cap)
        weight_mean = float(w.mean())
        truncated = float((log_r >= torch.log(torch.tensor(cap, dtype=torch.float64))).double().mean())
    return MismatchStats(tokens=n, kl=float(k3.mean()), k1=float((-log_r).mean()), abs_diff=float(log_r.abs().mean()),
                         weight_mean=weight_mean, truncated_frac=truncated)
