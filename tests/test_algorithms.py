from __future__ import annotations

import math

import pytest
import torch

from agentjet.algorithms import AdvantageEstimator, compute_advantages
from agentjet.algorithms.loss import ppo_clip_loss


def test_grpo_normalises_within_group() -> None:
    adv = compute_advantages([1.0, 0.0, 0.0, 1.0])
    assert sum(adv) == pytest.approx(0.0)
    assert adv[0] == pytest.approx(-adv[1])
    std = math.sqrt(sum(a * a for a in adv) / 3)
    assert std == pytest.approx(1.0, rel=1e-4)


def test_equal_rewards_give_zero_advantage() -> None:
    for est in AdvantageEstimator:
        assert compute_advantages([0.5, 0.5, 0.5], est) == pytest.approx([0, 0, 0])


def test_rloo_and_reinforce() -> None:
    assert compute_advantages([1.0, 0.0, 0.0], AdvantageEstimator.RLOO) == pytest.approx([1.0, -0.5, -0.5])
    assert compute_advantages([1.0, 0.0], AdvantageEstimator.REINFORCE) == pytest.approx([0.5, -0.5])


def test_non_finite_reward_rejected() -> None:
    with pytest.raises(ValueError, match="finite"):
        compute_advantages([1.0, float("nan")])


def test_ppo_clip_bounds_the_ratio() -> None:
    lp = torch.tensor([0.0, 0.0], requires_grad=True)
    old = torch.tensor([-1.0, 1.0])  # ratio e and 1/e
    adv = torch.tensor([1.0, -1.0])
    out = ppo_clip_loss(lp, old, adv, torch.ones(2), 0.2, 0.28)
    out.loss_sum.backward()
    # both ratios lie outside the clip range in the direction the advantage pushes: no gradient
    assert out.clipped == 2
    assert torch.all(lp.grad == 0)
    lp2 = torch.tensor([0.0], requires_grad=True)
    ppo_clip_loss(lp2, torch.tensor([0.0]), torch.tensor([2.0]), torch.ones(1), 0.2, 0.28).loss_sum.backward()
    assert lp2.grad.item() == pytest.approx(-2.0)  # d(-ratio*A)/dlogp at ratio 1
