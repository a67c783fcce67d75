"""The policy-loss family (algorithms/objectives.py, loss.py, tis.py): each objective against a value worked
out by hand on a few tokens, with its gradient."""

from __future__ import annotations

import math

import pytest
import torch

from agentjet.algorithms import AdvantageEstimator, compute_advantages
from agentjet.algorithms.loss import importance_log_ratio, kl_penalty, policy_loss, ppo_clip_loss
from agentjet.algorithms.objectives import (
    Aggregation,
    Correction,
    KLEstimator,
    Objective,
    PolicyLossConfig,
    RatioLevel,
    loss_normaliser,
)

F64 = torch.float64


def t(values: list[float], grad: bool = False) -> torch.Tensor:
    return torch.tensor(values, dtype=F64, requires_grad=grad)


def idx(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


def reference_ppo_clip(logprobs, behaviour, adv, weights, eps_low, eps_high, ref=None, kl_coef=0.0):
    """ppo_clip_loss as it was before the objective family (commit 86a1a0a), copied verbatim."""
    log_ratio = logprobs - behaviour
    ratio = torch.exp(log_ratio.clamp(max=20.0))
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    pg = -torch.minimum(unclipped, clipped)
    tok_loss = pg
    kl_sum = 0.0
    if ref is not None and kl_coef > 0:
        d = ref - logprobs
        kl = torch.exp(d) - d - 1.0
        tok_loss = tok_loss + kl_coef * kl
        kl_sum = float((kl.detach() * weights).sum())
    was_clipped = (clipped != unclipped).float()
    return ((tok_loss * weights).sum(), float((pg.detach() * weights).sum()), kl_sum, float(was_clipped.sum()),
            float(ratio.detach().max()), float(log_ratio.detach().abs().sum()))


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_default_objective_equals_the_old_ppo_clip_loss(kl_coef: float) -> None:
    g = torch.Generator().manual_seed(3)
    n = 40
    base = -torch.rand(n, generator=g, dtype=torch.float32) * 3
    old = base + (torch.rand(n, generator=g) - 0.5)  # ratios from ~0.6 to ~1.6: some clipped
    adv = torch.randn(n, generator=g)
    w = torch.rand(n, generator=g) + 0.5
    ref = base + (torch.rand(n, generator=g) - 0.5) * 0.2
    lp_a = base.clone().requires_grad_(True)
    lp_b = base.clone().requires_grad_(True)
    want = reference_ppo_clip(lp_a, old, adv, w, 0.2, 0.28, ref, kl_coef)
    want[0].backward()
    seq = torch.arange(n) // 4
    got = policy_loss(lp_b, old, adv, w, seq, PolicyLossConfig(kl_coef=kl_coef), ref)
    got.loss_sum.backward()
    assert torch.equal(got.loss_sum.detach(), want[0].detach())
    assert torch.equal(lp_b.grad, lp_a.grad)
    assert (got.pg_sum, got.kl_sum, got.clipped, got.ratio_max, got.abs_logprob_diff_sum) == want[1:]
    assert want[3] > 0  # the case exercises the clip
    wrapped = ppo_clip_loss(base, old, adv, w, 0.2, 0.28, ref, kl_coef)
    assert torch.equal(wrapped.loss_sum, want[0].detach())


def test_ppo_token_ratio_by_hand() -> None:
    lp = t([math.log(1.5), math.log(1.5), math.log(1.1)], grad=True)
    old = t([0.0, 0.0, 0.0])
    adv = t([1.0, -1.0, 2.0])
    out = policy_loss(lp, old, adv, t([1.0, 1.0, 1.0]), None, PolicyLossConfig())
    out.loss_sum.backward()
    # token 0: r=1.5 > 1.28 with A>0, clipped: -1.28, no gradient; token 1: A<0, min(-1.5, -1.28) = -1.5 -> +1.5,
    # d(-rA)/dlogp = -rA = 1.5; token 2: r=1.1 inside: -2.2, gradient -2.2
    assert out.loss_sum.item() == pytest.approx(-1.28 + 1.5 - 2.2)
    assert lp.grad.tolist() == pytest.approx([0.0, 1.5, -2.2])
    assert out.clipped == 2  # tokens 0 and 1 lie outside the band (token 1 keeps its gradient: min is unclipped)


def seq_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two sequences (1 and 3 trained tokens), on-policy (ratio 1, so PPO's token loss is -A)."""
    return t([0.0] * 4, grad=True), t([0.0] * 4), t([2.0, 1.0, -1.0, 3.0]), t([1.0, 0.5, 0.5, 0.5]), idx([0, 1, 1, 1])


@pytest.mark.parametrize(("aggregation", "want_loss", "want_grad"), [
    # DAPO: sum_t w_t (-A_t) / sum_t w_t = (-2 - 0.5*3) / 2.5
    (Aggregation.TOKEN_MEAN, (-2 - 0.5 * 3) / 2.5, [-2 / 2.5, -0.5 / 2.5, 0.5 / 2.5, -1.5 / 2.5]),
    # GRPO: sum_s w_s mean_t(-A) / sum_s w_s = (1 * -2 + 0.5 * -1) / 1.5
    (Aggregation.SEQ_MEAN, (-2 - 0.5) / 1.5, [-2 / 1.5, -0.5 / 3 / 1.5, 0.5 / 3 / 1.5, -1.5 / 3 / 1.5]),
    # Dr. GRPO: sum_t w_t (-A_t) / (sum_s w_s * 10)
    (Aggregation.CONSTANT, (-2 - 1.5) / 15, [-2 / 15, -0.5 / 15, 0.5 / 15, -1.5 / 15]),
])
def test_aggregations_by_hand(aggregation: Aggregation, want_loss: float, want_grad: list[float]) -> None:
    lp, old, adv, w, seq = seq_case()
    cfg = PolicyLossConfig(aggregation=aggregation, constant_tokens=10)
    z = loss_normaliser([1.0, 0.5], [1, 3], cfg)
    out = policy_loss(lp, old, adv, w, seq, cfg)
    (out.loss_sum / z).backward()
    assert (out.loss_sum / z).item() == pytest.approx(want_loss)
    assert lp.grad.tolist() == pytest.approx(want_grad)


@pytest.mark.parametrize("aggregation", list(Aggregation))
@pytest.mark.parametrize("level", list(RatioLevel))
def test_micro_batches_sum_to_the_whole_batch(aggregation: Aggregation, level: RatioLevel) -> None:
    g = torch.Generator().manual_seed(7)
    lengths = [3, 1, 4, 2]
    seq = idx([i for i, n in enumerate(lengths) for _ in range(n)])
    n = len(seq)
    base = (-torch.rand(n, generator=g, dtype=F64)).requires_grad_(True)
    old = base.detach() + (torch.rand(n, generator=g, dtype=F64) - 0.5) * 0.6
    adv = torch.randn(n, generator=g, dtype=F64)
    seq_w = [1.0, 0.5, 0.5, 1.0]
    w = torch.tensor([seq_w[i] for i in seq.tolist()], dtype=F64)
    cfg = PolicyLossConfig(aggregation=aggregation, ratio_level=level, correction=Correction.MASK_SEQUENCE,
                           correction_low=0.9, correction_high=1.1)
    z = loss_normaliser(seq_w, lengths, cfg)
    whole = policy_loss(base, old, adv, w, seq, cfg, proximal_logprobs=base.detach() + 0.05 * seq)
    (whole.loss_sum / z).backward()
    grad_whole = base.grad.clone()
    base.grad = None
    parts = [(0, 4), (4, 10)]  # sequences {0, 1} and {2, 3}, each with local indices
    total = 0.0
    for lo, hi in parts:
        s = seq[lo:hi] - seq[lo]
        out = policy_loss(base[lo:hi], old[lo:hi], adv[lo:hi], w[lo:hi], s, cfg,
                          proximal_logprobs=base.detach()[lo:hi] + 0.05 * seq[lo:hi])
        (out.loss_sum / z).backward()
        total += float(out.loss_sum.detach() / z)
    assert total == pytest.approx(float(whole.loss_sum.detach() / z), rel=1e-12)
    assert torch.allclose(base.grad, grad_whole, rtol=1e-12, atol=1e-15)


def test_dr_grpo_drops_the_std() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0]
    assert compute_advantages(rewards, AdvantageEstimator.GRPO, scale_by_std=False) == pytest.approx(
        [0.5, -0.5, -0.5, 0.5])
    assert compute_advantages(rewards, AdvantageEstimator.GRPO)[0] == pytest.approx(0.5 / math.sqrt(1 / 3), rel=1e-4)


def test_gspo_sequence_ratio_is_the_geometric_mean() -> None:
    lp = t([-0.1, -0.5, -1.0, -0.2, -0.3])
    old = t([-0.3, -0.2, -1.4, -0.2, -0.9])
    seq = idx([0, 0, 0, 1, 1])
    log_r = importance_log_ratio(lp, old, seq, RatioLevel.SEQUENCE)
    r0 = math.exp(((-0.1 + 0.3) + (-0.5 + 0.2) + (-1.0 + 1.4)) / 3)
    r1 = math.exp((0.0 + 0.6) / 2)
    assert torch.exp(log_r).tolist() == pytest.approx([r0, r0, r0, r1, r1])
    # equal to the product of the token ratios to the power 1/|y|
    assert r0 == pytest.approx((math.exp(0.2) * math.exp(-0.3) * math.exp(0.4)) ** (1 / 3))


def test_gspo_gradient_by_hand() -> None:
    a, b = 0.05, -0.03  # log ratios of a 2-token sequence: s = exp(0.01), inside the band
    lp = t([a, b], grad=True)
    cfg = PolicyLossConfig(ratio_level=RatioLevel.SEQUENCE, clip_eps_low=0.2, clip_eps_high=0.2)
    out = policy_loss(lp, t([0.0, 0.0]), t([1.0, 1.0]), t([1.0, 1.0]), idx([0, 0]), cfg)
    out.loss_sum.backward()
    s = math.exp((a + b) / 2)
    assert out.loss_sum.item() == pytest.approx(-2 * s)  # -s A for each of the two tokens
    assert lp.grad.tolist() == pytest.approx([-s, -s])  # d(-2 exp((a+b)/2))/da = -s
    # outside the band, the whole sequence loses its gradient (A > 0, s > 1 + eps)
    lp2 = t([0.5, 0.5], grad=True)
    out2 = policy_loss(lp2, t([0.0, 0.0]), t([1.0, 1.0]), t([1.0, 1.0]), idx([0, 0]), cfg)
    out2.loss_sum.backward()
    assert lp2.grad.tolist() == [0.0, 0.0] and out2.clipped == 2


def test_cispo_keeps_the_gradient_ppo_clips() -> None:
    lp_ppo = t([math.log(1.5), 0.0], grad=True)
    lp_cispo = t([math.log(1.5), 0.0], grad=True)
    old, adv, w = t([0.0, 0.0]), t([1.0, 1.0]), t([1.0, 1.0])
    policy_loss(lp_ppo, old, adv, w, None, PolicyLossConfig()).loss_sum.backward()
    out = policy_loss(lp_cispo, old, adv, w, None, PolicyLossConfig(objective=Objective.CISPO))
    out.loss_sum.backward()
    assert lp_ppo.grad[0].item() == 0.0  # PPO: r = 1.5 > 1.28 with A > 0, the token's gradient is dropped
    assert lp_cispo.grad.tolist() == pytest.approx([-1.28, -1.0])  # CISPO: -sg(clip(r)) A
    assert out.loss_sum.item() == pytest.approx(-1.28 * math.log(1.5))  # -w A log p (token 1: log p = 0)
    assert out.clipped == 1


@pytest.mark.parametrize(("estimator", "value", "grad"), [
    # d = log ref - log p = -0.5 - 0.0
    (KLEstimator.K1, 0.5, 1.0),
    (KLEstimator.K2, 0.125, 0.5),  # d^2/2; d/dlogp = -d
    (KLEstimator.K3, math.exp(-0.5) + 0.5 - 1, 1 - math.exp(-0.5)),  # exp(d) - d - 1; d/dlogp = 1 - exp(d)
])
def test_kl_estimators_by_hand(estimator: KLEstimator, value: float, grad: float) -> None:
    lp = t([0.0], grad=True)
    kl = kl_penalty(lp, t([-0.5]), estimator)
    kl.sum().backward()
    assert kl.item() == pytest.approx(value)
    assert lp.grad.item() == pytest.approx(grad)
    # inside the loss: kl_coef times it, on top of the policy-gradient term (on-policy, A = 0)
    lp2 = t([0.0], grad=True)
    out = policy_loss(lp2, t([0.0]), t([0.0]), t([1.0]), None,
                      PolicyLossConfig(kl_estimator=estimator, kl_coef=0.1), ref_logprobs=t([-0.5]))
    out.loss_sum.backward()
    assert out.kl_sum == pytest.approx(value)
    assert lp2.grad.item() == pytest.approx(0.1 * grad)


def test_token_mask_drops_exactly_the_tokens_outside_the_band() -> None:
    ws = [0.3, 1.0, 2.5, 0.5, 2.0, 0.49]
    behaviour = t([-math.log(w) for w in ws])  # proximal log p = 0, so w = p_prox / p_behaviour = ws
    lp = t([0.0] * 6, grad=True)
    cfg = PolicyLossConfig(correction=Correction.MASK_TOKEN, correction_low=0.5, correction_high=2.0)
    out = policy_loss(lp, behaviour, t([1.0] * 6), t([1.0] * 6), None, cfg)
    out.loss_sum.backward()
    kept = [False, True, False, True, True, False]  # the band is closed: 0.5 and 2.0 are kept
    # the PPO ratio is against the proximal (1 here): each kept token's gradient is -w A
    assert lp.grad.tolist() == pytest.approx([-w if k else 0.0 for w, k in zip(ws, kept, strict=True)])
    assert out.masked == 3
    assert out.is_weight_sum == pytest.approx(1.0 + 0.5 + 2.0)
    want_kl = sum(w - math.log(w) - 1 for w in ws)  # k3 of KL(p_s || p_t) with log(p_t/p_s) = log w
    assert out.mismatch_kl_sum == pytest.approx(want_kl)


def test_sequence_mask_keeps_or_drops_whole_sequences() -> None:
    # sequence 0: token weights 4 and 1/4 (both outside), geometric mean 1: kept; sequence 1: 3 and 3: dropped;
    # sequence 2: 1.2 and 0.9: kept
    ws = [4.0, 0.25, 3.0, 3.0, 1.2, 0.9]
    seq = idx([0, 0, 1, 1, 2, 2])
    lp = t([0.0] * 6, grad=True)
    cfg = PolicyLossConfig(correction=Correction.MASK_SEQUENCE, correction_low=0.5, correction_high=2.0)
    out = policy_loss(lp, t([-math.log(w) for w in ws]), t([1.0] * 6), t([1.0] * 6), seq, cfg)
    out.loss_sum.backward()
    g2 = math.sqrt(1.2 * 0.9)
    assert lp.grad.tolist() == pytest.approx([-1.0, -1.0, 0.0, 0.0, -g2, -g2])
    assert out.masked == 2
    # the token mask on the same tokens keeps only the last two
    lp_t = t([0.0] * 6, grad=True)
    out_t = policy_loss(lp_t, t([-math.log(w) for w in ws]), t([1.0] * 6), t([1.0] * 6), seq,
                        PolicyLossConfig(correction=Correction.MASK_TOKEN))
    assert out_t.masked == 4


def test_tis_truncates_the_weight() -> None:
    ws = [0.5, 1.5, 4.0]
    lp = t([0.0] * 3, grad=True)
    cfg = PolicyLossConfig(correction=Correction.TIS, correction_high=2.0)
    out = policy_loss(lp, t([-math.log(w) for w in ws]), t([1.0, -1.0, 1.0]), t([1.0] * 3), None, cfg)
    out.loss_sum.backward()
    assert lp.grad.tolist() == pytest.approx([-0.5, 1.5, -2.0])  # -min(w, 2) A; nothing dropped
    assert out.masked == 0 and out.is_weight_sum == pytest.approx(4.0)
    lp_s = t([0.0] * 3, grad=True)
    out_s = policy_loss(lp_s, t([-math.log(w) for w in ws]), t([1.0, 1.0, 1.0]), t([1.0] * 3), idx([0, 0, 1]),
                        PolicyLossConfig(correction=Correction.TIS_SEQUENCE, correction_high=2.0))
    out_s.loss_sum.backward()
    g = math.sqrt(0.5 * 1.5)
    assert lp_s.grad.tolist() == pytest.approx([-g, -g, -2.0])


def test_correction_takes_the_ratio_against_the_proximal_logprobs() -> None:
    # behaviour 0, proximal log 1.5 (w = 1.5, kept), current log 1.5 + log 1.1: the PPO ratio is 1.1 (inside),
    # so the gradient is -w r A = -1.5 * 1.1
    lp = t([math.log(1.5) + math.log(1.1)], grad=True)
    cfg = PolicyLossConfig(correction=Correction.MASK_TOKEN)
    out = policy_loss(lp, t([0.0]), t([1.0]), t([1.0]), None, cfg, proximal_logprobs=t([math.log(1.5)]))
    out.loss_sum.backward()
    assert lp.grad.item() == pytest.approx(-1.5 * 1.1)
    assert out.clipped == 0


def test_sequence_objectives_need_seq_index() -> None:
    for cfg in (PolicyLossConfig(ratio_level=RatioLevel.SEQUENCE), PolicyLossConfig(aggregation=Aggregation.SEQ_MEAN),
                PolicyLossConfig(correction=Correction.MASK_SEQUENCE)):
        with pytest.raises(ValueError, match="seq_index"):
            policy_loss(t([0.0]), t([0.0]), t([1.0]), t([1.0]), None, cfg)
    with pytest.raises(ValueError, match="correction_low"):
        PolicyLossConfig(correction_low=1.5)


def test_default_settings_give_the_default_objective() -> None:
    from agentjet.settings import LossSettings

    assert LossSettings().policy_loss_config() == PolicyLossConfig()


def test_sequence_index_lays_sequences_out_in_order() -> None:
    from agentjet.algorithms.sequences import sequence_index, sequence_lengths

    seq = sequence_index([2, 0, 3])
    assert seq.tolist() == [0, 0, 2, 2, 2]
    assert sequence_lengths(seq).tolist() == [2, 2, 3, 3, 3]
