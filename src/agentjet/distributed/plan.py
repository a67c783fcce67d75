"""How a batch is split across ranks (pure functions: the parent plans, each rank runs its share)."""

from __future__ import annotations

from dataclasses import dataclass

from agentjet.engines.base import TrainSample
from agentjet.engines.policy_step import micro_batches, total_loss_weight


@dataclass(frozen=True)
class StepPlan:
    shares: list[list[list[TrainSample]]]  # rank -> micro-batches -> samples
    n_micro: int  # forward/backward passes every rank runs (the longest share)
    total_weight: float  # over the whole batch: the loss normaliser on every rank

    @property
    def world_size(self) -> int:
        return len(self.shares)


def split_by_tokens(batch: list[TrainSample], world_size: int) -> list[list[TrainSample]]:
    """Longest sequences first, each to the rank with the fewest tokens so far (ties: the lower rank)."""
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    parts: list[list[TrainSample]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for s in sorted(batch, key=lambda s: len(s.input_ids), reverse=True):
        r = min(range(world_size), key=lambda i: (load[i], i))
        parts[r].append(s)
        load[r] += len(s.input_ids)
    return parts


def plan_step(batch: list[TrainSample], world_size: int, micro_batch_tokens: int) -> StepPlan:
    if not batch:
        raise ValueError("train_step needs at least one sample")
    total = total_loss_weight(batch)
    if total <= 0:
        raise ValueError("train_step: the batch has no trained tokens (all loss masks are 0)")
    shares = [micro_batches(part, micro_batch_tokens) for part in split_by_tokens(batch, world_size)]
    return StepPlan(shares=shares, n_micro=max(len(s) for s in shares), total_weight=total)


def padding_sample(pad_id: int) -> TrainSample:
    """A pass that changes nothing: one trained position with zero weight and zero advantage, so its loss and
    its gradient are exactly zero. Ranks with fewer micro-batches run it to keep collectives in step."""
    return TrainSample(input_ids=[pad_id, pad_id], loss_mask=[0, 1], behaviour_logprobs=[0.0, 0.0],
                       advantages=[0.0, 0.0], weight=0.0)
