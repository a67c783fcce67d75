"""Token-level PPO-clip loss with behaviour logprobs (decoupled, bounded-staleness friendly)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PolicyLossOutput:
    loss_sum: torch.Tensor  # weighted sum over tokens (divide by the batch's total weight)
    pg_sum: float
    kl_sum: float
    clipped: float  # number of tokens whose ratio was clipped
    ratio_max: float
    abs_logprob_diff_sum: float  # |logp_train - logp_behaviour|: train/inference mismatch


def ppo_clip_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> PolicyLossOutput:
    """All inputs are flat [N] over trained tokens. The importance ratio is clipped (PPO) so that
    tokens sampled by an older policy version are corrected, not trusted blindly."""
    log_ratio = logprobs - behaviour_logprobs
    ratio = torch.exp(log_ratio.clamp(max=20.0))
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high) * advantages
    pg = -torch.minimum(unclipped, clipped)
    tok_loss = pg
    kl_sum = 0.0
    if ref_logprobs is not None and kl_coef > 0:
        d = ref_logprobs - logprobs
        kl = torch.exp(d) - d - 1.0  # k3 estimator, >= 0
        tok_loss = tok_loss + kl_coef * kl
        kl_sum = float((kl.detach() * weights).sum())
    with torch.no_grad():
        was_clipped = (clipped != unclipped).float()
    return PolicyLossOutput(
        loss_sum=(tok_loss * weights).sum(),
        pg_sum=float((pg.detach() * weights).sum()),
        kl_sum=kl_sum,
        clipped=float(was_clipped.sum()),
        ratio_max=float(ratio.detach().max()) if ratio.numel() else 1.0,
        abs_logprob_diff_sum=float(log_ratio.detach().abs().sum()),
    )
