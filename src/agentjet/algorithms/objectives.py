"""The choices that make up a policy-gradient objective (no torch here: the settings import these enums).

One :class:`PolicyLossConfig` names an objective by five independent choices (see docs/algorithms.md):

- ``objective``: PPO-clip, or CISPO (a clipped, detached IS weight times the logprob);
- ``ratio_level``: the importance ratio per token (PPO) or per sequence (GSPO: the geometric mean of the
  token ratios);
- ``aggregation``: how token losses become the step's loss (DAPO's token mean, GRPO's sequence mean, or
  Dr. GRPO's constant normaliser);
- ``kl_estimator`` and ``kl_coef``: a KL penalty to the initial weights (k1, k2 or k3; off at ``kl_coef`` 0);
- ``correction``: train/sampler mismatch correction (truncated IS or masked IS, per token or per sequence).

How a step splits exactly across micro-batches and ranks: the loss of a batch is
``sum_s u_s * sum_{t in s} l_t / Z``. The per-sequence factor ``u_s`` depends only on the sequence itself
(its weight and its length), so each micro-batch computes its part alone; ``Z`` (:func:`loss_normaliser`)
depends on the whole batch and is computed once, before the step, from every sequence's weight and trained
length. Each micro-batch backpropagates ``loss_sum / Z``; the sums over micro-batches and ranks are the
batch's gradient. A sequence must lie whole in one micro-batch (``engines/policy_step.micro_batches`` never
splits one), because sequence-level ratios and means need all of its tokens.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


class Objective(enum.StrEnum):
    PPO_CLIP = "ppo_clip"  # -min(r A, clip(r) A) (Schulman et al., 2017)
    CISPO = "cispo"  # -sg(clip(r)) A log p (MiniMax-M1, 2025): no token's gradient is dropped


class RatioLevel(enum.StrEnum):
    TOKEN = "token"  # r_t = p(y_t) / p_old(y_t) (PPO)
    SEQUENCE = "sequence"  # r_s = exp(mean_t log r_t), one ratio per sequence (GSPO, Zheng et al., 2025)


class Aggregation(enum.StrEnum):
    TOKEN_MEAN = "token_mean"  # sum of token losses / the batch's token count (DAPO, Yu et al., 2025)
    SEQ_MEAN = "seq_mean"  # mean over a sequence's tokens, then over the batch's sequences (GRPO as published)
    CONSTANT = "constant"  # sum of token losses / (sequences x a constant length) (Dr. GRPO, Liu et al., 2025)


class KLEstimator(enum.StrEnum):
    """Estimators of KL(pi || ref) from tokens sampled by pi, with ``d = log ref - log pi`` (Schulman, 2020)."""

    K1 = "k1"  # -d: unbiased, can be negative
    K2 = "k2"  # d^2 / 2: low variance, biased
    K3 = "k3"  # exp(d) - d - 1: unbiased and >= 0


class Correction(enum.StrEnum):
    """Train/sampler mismatch correction, on the weight ``w = p_proximal / p_behaviour`` (the trainer's
    logprob before the update over the sampler's)."""

    AUTO = "auto"  # the path's default (resolve_correction); a setting only, never a PolicyLossConfig's value
    NONE = "none"  # the PPO ratio is taken against the behaviour logprobs directly (no separate weight)
    TIS = "tis"  # per-token weight min(w, high) (Yao et al., 2025)
    TIS_SEQUENCE = "tis_sequence"  # one weight per sequence: min(geometric mean of w, high)
    MASK_TOKEN = "mask_token"  # drop tokens whose w leaves [low, high] (masked IS, "icepop")
    MASK_SEQUENCE = "mask_sequence"  # drop sequences whose geometric-mean w leaves [low, high]

    @property
    def per_sequence(self) -> bool:
        return self in (Correction.TIS_SEQUENCE, Correction.MASK_SEQUENCE)


# What ``correction: auto`` is where another engine samples than the one that trains (vLLM: other kernels, bf16).
# Chosen by the objectives ablation; the figures and the reason are in docs/algorithms.md, "The default".
SEPARATE_SAMPLER_CORRECTION = Correction.TIS


def resolve_correction(correction: Correction, separate_sampler: bool) -> Correction:
    """``auto`` as the path's default: :data:`SEPARATE_SAMPLER_CORRECTION` where a separate engine samples,
    ``none`` where the trainer's own engine does (the embedded engine: the only mismatch is staleness, which the
    PPO ratio against the behaviour logprobs already bounds). Any other value is kept."""
    if correction is not Correction.AUTO:
        return correction
    return SEPARATE_SAMPLER_CORRECTION if separate_sampler else Correction.NONE


@dataclass(frozen=True)
class PolicyLossConfig:
    """A plain, picklable value (a trainer group sends it to its ranks); build it from the ``loss`` settings
    with ``LossSettings.policy_loss_config(separate_sampler)``. The defaults are token-level PPO-clip, DAPO's
    token mean, no KL and no correction: the loss AgentJet has always trained with on the embedded engine."""

    objective: Objective = Objective.PPO_CLIP
    ratio_level: RatioLevel = RatioLevel.TOKEN
    aggregation: Aggregation = Aggregation.TOKEN_MEAN
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    kl_estimator: KLEstimator = KLEstimator.K3
    kl_coef: float = 0.0
    correction: Correction = Correction.NONE
    correction_low: float = 0.5
    correction_high: float = 2.0
    constant_tokens: int = 1024  # Dr. GRPO's constant: the generation budget in tokens

    def __post_init__(self) -> None:
        if self.correction is Correction.AUTO:
            raise ValueError("PolicyLossConfig.correction: 'auto' is resolved before the loss sees it "
                             "(resolve_correction)")
        if not 0 < self.correction_low <= 1 <= self.correction_high:
            raise ValueError("PolicyLossConfig: need 0 < correction_low <= 1 <= correction_high")
        if self.constant_tokens < 1:
            raise ValueError("PolicyLossConfig.constant_tokens must be >= 1")

    @property
    def needs_sequences(self) -> bool:
        """Whether the loss needs to know which tokens share a sequence (``seq_index``)."""
        return (self.ratio_level is RatioLevel.SEQUENCE or self.aggregation is Aggregation.SEQ_MEAN
                or self.correction.per_sequence)


def sequence_factor(weight: float, length: int, aggregation: Aggregation) -> float:
    """``u_s``: the factor on each token loss of a sequence with this loss weight and trained length."""
    if aggregation is Aggregation.SEQ_MEAN:
        return weight / length if length else 0.0
    return weight


def loss_normaliser(seq_weights: Sequence[float], seq_lengths: Sequence[int], config: PolicyLossConfig) -> float:
    """``Z`` over the WHOLE batch (every rank's sequences): the step backpropagates each micro-batch's
    ``loss_sum / Z``. Token mean: the weighted token count (what ``total_loss_weight`` has always been);
    sequence mean: the weighted sequence count; constant: the weighted sequence count x ``constant_tokens``.
    Sequences with no trained token count in none of them."""
    if len(seq_weights) != len(seq_lengths):
        raise ValueError("loss_normaliser: one weight per sequence length")
    pairs = [(w, n) for w, n in zip(seq_weights, seq_lengths, strict=True) if n > 0]
    if config.aggregation is Aggregation.TOKEN_MEAN:
        return float(sum(w * n for w, n in pairs))
    seqs = float(sum(w for w, _ in pairs))
    if config.aggregation is Aggregation.SEQ_MEAN:
        return seqs
    return seqs * config.constant_tokens
