"""The trainer group on CUDA (NCCL, bf16 MixedPrecisionPolicy): skipped without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentjet.distributed import LearnerGroupSettings, TrainerGroup
from agentjet.learners.policy_step import StepConfig
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import LearnerSettings, LossSettings, PlacementSettings

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(300),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_group_on_cuda_tracks_the_single_process_trainer(tiny_model_path: Path, batches, tmp_path: Path) -> None:
    from agentjet.layouts import embedded_engine

    learner = LearnerSettings(autocast_bf16=True, learning_rate=1e-3)  # plain: autocast; group: bf16 params
    config = StepConfig.from_settings(learner, LossSettings())
    plain = embedded_engine(tiny_model_path, None, learner, LossSettings(),
                            PlacementSettings(device="cuda", dtype="float32"))
    procs = min(2, torch.cuda.device_count())
    settings = LearnerGroupSettings(procs=procs, device="cuda", work_dir=tmp_path, startup_timeout_s=180,
                                    step_timeout_s=60)
    with TrainerGroup(tiny_model_path, settings, config) as group:
        assert group.backend == "nccl"
        for batch in batches[:2]:
            m, r = group.train_step(batch), run_blocking(plain.train_step(batch))
            assert m["trained_tokens"] == r["trained_tokens"]
            assert m["loss"] == pytest.approx(r["loss"], rel=5e-2, abs=1e-3)  # bf16 rounding differs
            assert m["grad_norm"] == pytest.approx(r["grad_norm"], rel=5e-2)
    assert group.exit_codes[-1] == 0
