"""Policy-gradient losses over flat trained tokens, with behaviour logprobs (bounded-staleness friendly).

:func:`policy_loss` is the one entry point a policy step calls per micro-batch; the objective is chosen by a
:class:`~agentjet.algorithms.objectives.PolicyLossConfig` (docs/algorithms.md). Its ``loss_sum`` is a sum
over the micro-batch's tokens, each scaled by its sequence's factor; the step divides it by
:func:`~agentjet.algorithms.objectives.loss_normaliser` over the whole batch, so that micro-batches and ranks
sum to the batch's gradient (see ``agentjet.algorithms.objectives``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentjet.algorithms.objectives import (
    Aggregation,
    Correction,
    KLEstimator,
    Objective,
    PolicyLossConfig,
    RatioLevel,
)
from agentjet.algorithms.sequences import sequence_lengths, sequence_mean
from agentjet.algorithms.tis import correction_weights, mismatch_kl_terms

MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: a ratio past this is an outlier, not a number worth overflowing on


@dataclass
class PolicyLossOutput:
    loss_sum: torch.Tensor  # weighted sum over tokens (divide by the batch's loss normaliser)
    pg_sum: float
    kl_sum: float
    clipped: float  # number of tokens whose ratio was clipped
    ratio_max: float
    abs_logprob_diff_sum: float  # |logp_train - logp_behaviour|: train/inference mismatch
    # mismatch correction (sums over tokens, so that micro-batches and ranks add up; divide by the token count)
    mismatch_kl_sum: float = 0.0  # k3 KL(p_behaviour || p_proximal) per token
    masked: float = 0.0  # tokens the correction dropped
    is_weight_sum: float = 0.0  # the correction's weight (1 per token without correction)
    loss_value: float = 0.0  # ``loss_sum`` as a number (read back with the other sums)


def importance_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, seq_index: torch.Tensor | None,
                         level: RatioLevel) -> torch.Tensor:
    """Per token ``log p - log p_old`` (token level), or the mean of it over the token's sequence (sequence
    level: the log of GSPO's geometric-mean ratio; its gradient reaches every token of the sequence)."""
    log_ratio = logprobs - old_logprobs
    if level is RatioLevel.TOKEN:
        return log_ratio
    if seq_index is None:
        raise ValueError("a sequence-level ratio needs seq_index")
    return sequence_mean(log_ratio, seq_index)


def ppo_clip_terms(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-clip per token: ``-min(r A, clip(r, 1-eps_low, 1+eps_high) A)``, and where the clip changed ``r A``
    (where the gradient is dropped when the clipped side is the minimum)."""
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    return -torch.minimum(unclipped, clipped), (clipped != unclipped).detach()


def cispo_terms(ratio: torch.Tensor, logprobs: torch.Tensor, advantages: torch.Tensor, eps_low: float,
                eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO per token: ``-sg(clip(r, 1-eps_low, 1+eps_high)) A log p``. The weight is clipped and detached,
    so every token keeps a gradient ``-w A`` on its logprob (PPO drops it where the clip binds)."""
    w = ratio.detach().clamp(1.0 - eps_low, 1.0 + eps_high)
    return -w * advantages * logprobs, (w != ratio.detach())


def dro_terms(logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, advantages: torch.Tensor, beta: float
              ) -> torch.Tensor:
    """DRO per token (Richemond et al., 2024; Kimi Team et al., 2025, as Tinker defines its ``dro`` loss):
    ``-(A log p - beta/2 (log p - log q)^2)``: a policy gradient held near the sampler by a quadratic penalty on the
    log-ratio instead of a clip, so it needs no ratio at all and suits off-policy (even offline) data."""
    return -(logprobs * advantages - 0.5 * beta * (logprobs - behaviour_logprobs) ** 2)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per token, an estimate of KL(pi || ref) from tokens drawn from pi, ``d = log ref - log pi``."""
    d = ref_logprobs - logprobs
    if estimator is KLEstimator.K1:
        return -d
    if estimator is KLEstimator.K2:
        return 0.5 * d * d
    return torch.exp(d) - d - 1.0


def sequence_factors(weights: torch.Tensor, seq_index: torch.Tensor | None, aggregation: Aggregation
                     ) -> torch.Tensor:
    """Per token, its sequence's factor ``u_s`` (``objectives.sequence_factor``): the loss weight, divided by
    the sequence's trained length for the sequence mean."""
    if aggregation is not Aggregation.SEQ_MEAN:
        return weights
    if seq_index is None:
        raise ValueError("the seq_mean aggregation needs seq_index")
    return weights / sequence_lengths(seq_index).to(weights.dtype)


def policy_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    seq_index: torch.Tensor | None,
    config: PolicyLossConfig,
    ref_logprobs: torch.Tensor | None = None,
    proximal_logprobs: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """The loss of one micro-batch. Inputs are flat ``[N]`` over its trained tokens: the trainer's logprobs
    (with gradient), the sampler's behaviour logprobs, advantages, each token's sequence loss weight, and
    ``seq_index`` (each token's sequence, ``0 .. S-1``; needed by sequence-level ratios, corrections and the
    sequence mean, else may be None). ``ref_logprobs``: the initial weights' logprobs (KL, when ``kl_coef`` >
    0). ``proximal_logprobs``: the trainer's logprobs before this update (defaults to ``logprobs`` detached,
    which they are on the step's only pass over a batch).

    Without correction the ratio is ``p / p_behaviour`` (PPO with behaviour logprobs). With correction it is
    ``p / p_proximal`` and each token's policy-gradient term is scaled by the correction weight on
    ``p_proximal / p_behaviour`` (decoupled PPO; masked tokens keep neither gradient nor KL term)."""
    if config.needs_sequences and seq_index is None:
        raise ValueError("policy_loss: this objective needs seq_index (each token's sequence)")
    proximal = proximal_logprobs if proximal_logprobs is not None else logprobs.detach()
    if config.correction is Correction.NONE:
        old = behaviour_logprobs
        correction = None
    else:
        old = proximal
        correction = correction_weights(proximal, behaviour_logprobs, seq_index, config.correction,
                                        config.correction_low, config.correction_high)
    log_ratio = importance_log_ratio(logprobs, old, seq_index, config.ratio_level)
    ratio = torch.exp(log_ratio.clamp(max=MAX_LOG_RATIO))
    if config.objective is Objective.CISPO:
        pg, was_clipped = cispo_terms(ratio, logprobs, advantages, config.clip_eps_low, config.clip_eps_high)
    else:
        pg, was_clipped = ppo_clip_terms(ratio, advantages, config.clip_eps_low, config.clip_eps_high)
    if correction is not None:
        pg = pg * correction.weights
    factors = sequence_factors(weights, seq_index, config.aggregation)
    tok_loss = pg
    with torch.no_grad():  # the metric sums, read back to the host together (one device sync, not one each)
        sums: dict[str, torch.Tensor] = {
            "pg_sum": (pg.detach() * factors).sum(), "clipped": was_clipped.float().sum(),
            "abs_logprob_diff_sum": (logprobs - behaviour_logprobs).detach().abs().sum(),
            "mismatch_kl_sum": mismatch_kl_terms(proximal.double(), behaviour_logprobs.double()).sum()}
        if ratio.numel():
            sums["ratio_max"] = ratio.detach().max()
        if correction is not None:
            sums["masked"] = (~correction.kept).sum()
            sums["is_weight_sum"] = correction.weights.sum()
    if ref_logprobs is not None and config.kl_coef > 0:
        kl = kl_penalty(logprobs, ref_logprobs, config.kl_estimator)
        if correction is not None:
            kl = kl * correction.kept
        tok_loss = tok_loss + config.kl_coef * kl
        sums["kl_sum"] = (kl.detach() * factors).sum()
    loss_sum = (tok_loss * factors).sum()
    sums["loss_value"] = loss_sum.detach()
    # float64 holds every float32 (and int) sum exactly: the same numbers as one float() per sum
    host = dict(zip(sums, torch.stack([v.double() for v in sums.values()]).tolist(), strict=True))
    return PolicyLossOutput(
        loss_sum=loss_sum,
        loss_value=host["loss_value"],
        pg_sum=host["pg_sum"],
        kl_sum=host.get("kl_sum", 0.0),
        clipped=host["clipped"],
        ratio_max=host.get("ratio_max", 1.0),
        abs_logprob_diff_sum=host["abs_logprob_diff_sum"],
        mismatch_kl_sum=host["mismatch_kl_sum"],
        masked=host.get("masked", 0.0),
        is_weight_sum=host.get("is_weight_sum", float(logprobs.numel())),
    )


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
    """Token-level PPO-clip with a k3 KL term, summed with token weights: :func:`policy_loss` with the
    default objective (kept for callers that predate it)."""
    config = PolicyLossConfig(clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, kl_coef=kl_coef)
    return policy_loss(logprobs, behaviour_logprobs, advantages, weights, None, config, ref_logprobs)
