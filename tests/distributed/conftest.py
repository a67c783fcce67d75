"""Fixtures for trainer-group tests: tiny-model batches with realistic behaviour logprobs, and the
single-process reference (the embedded engine) they are compared against."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from agentjet.engines.base import TrainSample
from agentjet.learners.policy_step import StepConfig
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import LearnerSettings, LossSettings

LR = 1e-3
# Each step moves the weights by about LR (AdamW); a step applied twice or lost shows up far above this.
WEIGHT_ATOL = 5e-5
LOSS_RTOL = 1e-4


# small micro-batches: each rank runs several passes, and ranks get different numbers of them; the KL term on, so
# the frozen reference takes part too (both sides take it from the initial weights)
LEARNER = LearnerSettings(micro_batch_tokens=48, learning_rate=LR)
LOSS = LossSettings(kl_coef=0.05)


def train_config() -> StepConfig:
    return StepConfig.from_settings(LEARNER, LOSS)


def plain_engine(model: Path | str, loss: LossSettings = LOSS):  # noqa: ANN201
    """The single-process engine with the same settings."""
    from agentjet.layouts import embedded_engine

    return embedded_engine(model, None, LEARNER, loss)


def make_batch(engine, seed: int, n: int = 6) -> list[TrainSample]:
    """Samples whose behaviour logprobs are the engine's own (plus noise), so ratios sit near 1 and clipping,
    weights and temperatures all take part."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(6, 28)
        prompt = rng.randint(2, length - 2)
        ids = [rng.randint(3, 1000) for _ in range(length)]
        mask = [0] * prompt + [1] * (length - prompt)
        out.append(TrainSample(ids, mask, [0.0] * length, [rng.uniform(-1, 1) if m else 0.0 for m in mask],
                               temperature=rng.choice([1.0, 0.7]), weight=rng.choice([1.0, 0.5])))
    for s, lps in zip(out, run_blocking(engine.learner.score(out)), strict=True):
        it = iter(lps)
        s.behaviour_logprobs = [next(it) + rng.gauss(0, 0.1) if m else 0.0 for m in s.loss_mask]
    return out


@pytest.fixture(scope="session")
def batches(tiny_model_path: Path) -> list[list[TrainSample]]:
    engine = plain_engine(tiny_model_path)
    return [make_batch(engine, seed) for seed in range(6)]


@pytest.fixture
def reference(tiny_model_path: Path) -> Callable[[list[list[TrainSample]]], tuple[list[dict], dict]]:
    """Run batches through the single-process trainer: (metrics per step, final state dict)."""
    def run(steps: list[list[TrainSample]], loss: LossSettings = LOSS) -> tuple[list[dict], dict[str, torch.Tensor]]:
        engine = plain_engine(tiny_model_path, loss)
        metrics = [run_blocking(engine.train_step(b)) for b in steps]
        run_blocking(engine.close())
        return metrics, {k: v.detach().clone() for k, v in engine.generator.model.state_dict().items()}

    return run


def max_weight_diff(weights: Path, state: dict[str, torch.Tensor]) -> float:
    from safetensors.torch import load_file

    got = load_file(str(weights))
    assert set(got) == set(state) | {"lm_head.weight"}  # untied: the head is written out (engines/weights.py)
    return max(float((got[k] - state[k]).abs().max()) for k in got)
