"""How a batch is split across ranks (pure functions: the parent plans, each rank runs its share)."""

from __future__ import annotations

from dataclasses import dataclass

from agentjet.algorithms.objectives import PolicyLossConfig
from agentjet.engines.base import TrainSample
from agentjet.learners.policy_step import micro_batch_indices, total_loss_weight


@dataclass(frozen=True)
class StepPlan:
    shares: list[list[list[TrainSample]]]  # rank -> micro-batches -> samples
    n_micro: int  # forward/backward passes every rank runs (the longest share)
    total_weight: float  # over the whole batch: the loss normaliser on every rank
    indices: list[list[list[int]]]  # rank -> micro-batches -> each sample's index in the batch

    def gather(self, per_rank: list[list[list[list[float]]]], n: int) -> list[list[float]]:
        """Per-sample results the ranks sent back (rank -> micro-batch -> sample) in the batch's order."""
        out: list[list[float]] = [[] for _ in range(n)]
        for idx_rank, got_rank in zip(self.indices, per_rank, strict=True):
            for idx_mb, got_mb in zip(idx_rank, got_rank, strict=True):
                for i, values in zip(idx_mb, got_mb, strict=True):
                    out[i] = values
        return out

    @property
    def world_size(self) -> int:
        return len(self.shares)


def split_by_tokens(batch: list[TrainSample], world_size: int) -> list[list[int]]:
    """Indices into ``batch``: longest sequences first, each to the rank with the fewest tokens so far (ties:
    the lower rank)."""
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    parts: list[list[int]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for i in sorted(range(len(batch)), key=lambda i: len(batch[i].input_ids), reverse=True):
        r = min(range(world_size), key=lambda k: (load[k], k))
        parts[r].append(i)
        load[r] += len(batch[i].input_ids)
    return parts


def check_batch(batch: list[TrainSample], need_trained_tokens: bool = True,
                loss: PolicyLossConfig | None = None) -> float:
    """The batch's total loss weight; a ValueError for a batch that cannot be trained (checked before anything
    starts)."""
    if not batch:
        raise ValueError("train_step needs at least one sample")
    total = total_loss_weight(batch, loss)
    if need_trained_tokens and total <= 0:
        raise ValueError("train_step: the batch has no trained tokens (all loss masks are 0)")
    return total


def plan_step(batch: list[TrainSample], world_size: int, micro_batch_tokens: int,
              need_trained_tokens: bool = True, loss: PolicyLossConfig | None = None) -> StepPlan:
    """``loss``: the objective whose normaliser ``Z`` every rank divides by (the default: token mean)."""
    total = check_batch(batch, need_trained_tokens, loss)
    indices = []
    for part in split_by_tokens(batch, world_size):
        mine = [batch[i] for i in part]
        indices.append([[part[j] for j in mb] for mb in micro_batch_indices(mine, micro_batch_tokens)])
    shares = [[[batch[i] for i in mb] for mb in rank] for rank in indices]
    return StepPlan(shares=shares, n_micro=max(len(s) for s in shares), total_weight=total, indices=indices)


def padding_sample(pad_id: int) -> TrainSample:
    """A pass that changes nothing: one trained position with zero weight and zero advantage, so its loss and
    its gradient are exactly zero. Ranks with fewer micro-batches run it to keep collectives in step."""
    return TrainSample(input_ids=[pad_id, pad_id], loss_mask=[0, 1], behaviour_logprobs=[0.0, 0.0],
                       advantages=[0.0, 0.0], weight=0.0)
