"""The pure parts of the trainer group: how a batch is split, settings, torchrun command lines, weight files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from tests.distributed.conftest import train_config

from agentjet.distributed import LearnerGroupSettings, TrainerGroup
from agentjet.distributed.launch import torchrun_command
from agentjet.distributed.plan import padding_sample, plan_step, split_by_tokens
from agentjet.engines.base import TrainSample
from agentjet.learners.policy_step import StepConfig, collate, micro_batch_loss, total_loss_weight
from agentjet.settings import LearnerSettings, LossSettings
from agentjet.weights.io import copy_weights_into
from agentjet.weights.io import write_safetensors as write_weights


def sample(n: int, trained: int = 1, weight: float = 1.0) -> TrainSample:
    mask = [0] * (n - trained) + [1] * trained
    return TrainSample(list(range(3, 3 + n)), mask, [-1.0] * n, [0.5] * n, weight=weight)


def test_split_balances_tokens_and_keeps_every_sample_once() -> None:
    batch = [sample(n) for n in (40, 5, 30, 7, 22, 9, 3)]
    parts = split_by_tokens(batch, 3)  # indices into the batch
    assert sorted(i for p in parts for i in p) == list(range(len(batch)))
    loads = [sum(len(batch[i].input_ids) for i in p) for p in parts]
    assert max(loads) - min(loads) <= 40  # at most the longest sample apart
    assert loads == [40, 37, 39]  # 40 | 30+7 | 22+9+5+3


def test_plan_gathers_per_sample_results_back_in_batch_order() -> None:
    batch = [sample(n) for n in (40, 5, 30, 7, 22, 9, 3)]
    plan = plan_step(batch, 3, micro_batch_tokens=45)
    sent_back = [[[[float(len(s.input_ids))] for s in mb] for mb in rank] for rank in plan.shares]
    assert plan.gather(sent_back, len(batch)) == [[float(len(s.input_ids))] for s in batch]


def test_more_ranks_than_samples_leaves_ranks_to_padding() -> None:
    plan = plan_step([sample(8, 3, weight=0.5), sample(6, 2)], world_size=4, micro_batch_tokens=1000)
    assert [len(s) for s in plan.shares] == [1, 1, 0, 0]
    assert plan.n_micro == 1
    assert plan.total_weight == 0.5 * 3 + 2  # the whole batch's, the same on every rank


def test_plan_refuses_empty_and_untrained_batches() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        plan_step([], 2, 100)
    with pytest.raises(ValueError, match="no trained tokens"):
        plan_step([sample(5, 0)], 2, 100)


def test_n_micro_is_the_longest_share() -> None:
    batch = [sample(10) for _ in range(5)] + [sample(50)]
    plan = plan_step(batch, 2, micro_batch_tokens=20)
    assert plan.n_micro == max(len(s) for s in plan.shares) >= 2
    assert total_loss_weight(batch) == plan.total_weight


def test_padding_pass_has_exactly_zero_loss_and_gradient() -> None:
    pad = padding_sample(0)
    batch = collate([pad], pad_id=0)
    lp = torch.tensor([-3.0], requires_grad=True)
    config = StepConfig.from_settings(LearnerSettings(learning_rate=1e-3), LossSettings(kl_coef=0.1))
    res = micro_batch_loss(lp, [pad], config, ref_logprobs=torch.tensor([-2.0]))
    res.loss_sum.backward()
    assert float(res.loss_sum.detach()) == 0.0 and float(lp.grad.abs().sum()) == 0.0
    assert batch.predicted_mask.sum() == 1


def test_settings_validate_several_nodes() -> None:
    assert LearnerGroupSettings(procs=4).world_size == 4
    with pytest.raises(ValidationError, match="rdzv_endpoint, control_port, auth_token"):
        LearnerGroupSettings(nnodes=2)
    with pytest.raises(ValidationError, match="node_rank"):
        LearnerGroupSettings(nnodes=2, node_rank=2)
    with pytest.raises(ValidationError, match="host:port"):
        LearnerGroupSettings(rdzv_endpoint="node0")
    s = LearnerGroupSettings(procs=8, nnodes=2, rdzv_endpoint="node0:29400", control_port=29500, auth_token="x")
    assert s.world_size == 16
    with pytest.raises(ValidationError, match="export_dir"):
        LearnerGroupSettings(procs=8, nnodes=2, node_rank=1, rdzv_endpoint="n0:1", control_port=2, auth_token="x")
    with pytest.raises(ValidationError, match="fewer GPUs"):
        LearnerGroupSettings(procs=4, cuda_visible_devices="2,3")
    assert LearnerGroupSettings(procs=2, cuda_visible_devices="2,3").cuda_visible_devices == "2,3"
    with pytest.raises(ValidationError):
        LearnerGroupSettings(cuda_visible_devices="gpu0")
    assert LearnerGroupSettings().procs == 0  # off: the server trains in its own process
    with pytest.raises(ValueError, match="at least one rank"):
        TrainerGroup("tiny-random", LearnerGroupSettings(), train_config())
    with pytest.raises(ValidationError):
        LearnerGroupSettings(step_timeout_s=0)


def test_torchrun_commands() -> None:
    one = torchrun_command(procs=2, nnodes=1, node_rank=0, rdzv_endpoint=None, control="h:1", python="py")
    assert one[:3] == ["py", "-m", "torch.distributed.run"] and "--standalone" in one and "--nproc-per-node=2" in one
    assert one[-4:] == ["-m", "agentjet.distributed.worker", "--control", "h:1"]
    two = torchrun_command(procs=8, nnodes=2, node_rank=1, rdzv_endpoint="n0:29400", control="n0:5", python="py")
    # static rendezvous: ranks follow node ranks, so rank 0 (the weight writer) is on node 0
    assert {"--nnodes=2", "--node-rank=1", "--rdzv-backend=static", "--rdzv-endpoint=n0:29400",
            "--max-restarts=0"} <= set(two)
    assert "--standalone" not in two
    with pytest.raises(ValueError):
        torchrun_command(procs=1, nnodes=2, node_rank=0, rdzv_endpoint=None, control="h:1")


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(3, 2)
        self.register_buffer("b", torch.zeros(4))


def test_weights_round_trip_in_place(tmp_path: Path) -> None:
    src, dst = Tiny(), Tiny()
    src.b += 1
    path = write_weights(src.state_dict(), tmp_path / "w.safetensors")
    weight = dst.a.weight  # the same Parameter object afterwards: references stay valid
    assert copy_weights_into(dst, path) == 3
    assert dst.a.weight is weight
    for k, v in src.state_dict().items():
        assert torch.equal(dst.state_dict()[k], v)
    assert not list(tmp_path.glob(".*.tmp*"))


def test_weights_that_do_not_fit_leave_the_model_untouched(tmp_path: Path) -> None:
    dst = Tiny()
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    bad_shape = {**Tiny().state_dict(), "b": torch.ones(5)}
    with pytest.raises(ValueError, match="shape"):
        copy_weights_into(dst, write_weights(bad_shape, tmp_path / "shape.safetensors"))
    missing = {k: v for k, v in Tiny().state_dict().items() if k != "a.bias"}
    with pytest.raises(ValueError, match="missing"):
        copy_weights_into(dst, write_weights(missing, tmp_path / "missing.safetensors"))
    extra = {**Tiny().state_dict(), "c": torch.ones(1)}
    with pytest.raises(ValueError, match="unexpected"):
        copy_weights_into(dst, write_weights(extra, tmp_path / "extra.safetensors"))
    for k, v in dst.state_dict().items():
        assert torch.equal(v, before[k])


def test_stale_shm_dirs_of_dead_servers_are_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from agentjet.distributed import group
    from agentjet.weights import shm

    monkeypatch.setattr(shm, "SHM", tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    prefix = shm.shm_prefix(group.SHM_OWNER)
    stale = tmp_path / f"{prefix}recovery-{dead.pid}-abc"
    live = tmp_path / f"{prefix}weights-{os.getpid()}-def"
    other = tmp_path / "someone-else-123-x"
    others_stale = tmp_path / f"{shm.shm_prefix('engine')}weights-{dead.pid}-ghi"  # another owner's: its own sweep
    for d in (stale, live, other, others_stale):
        d.mkdir()
    fresh = shm.shm_dir(group.SHM_OWNER, "weights", 1)
    assert fresh is not None and fresh.parent == tmp_path and f"-{os.getpid()}-" in fresh.name
    assert fresh.name.startswith(f"{prefix}weights-")
    assert not stale.exists() and live.exists() and other.exists() and others_stale.exists()