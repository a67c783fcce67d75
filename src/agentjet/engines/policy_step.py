"""The pieces of one policy-gradient train step, shared by the embedded engine (``engines/hf.py``) and the
FSDP2 trainer group (``agentjet.distributed``), so that both compute the same thing.

A step over a batch is: split it into micro-batches (:func:`micro_batches`), pad each one
(:func:`collate`), compute the logprob of every trained token (:func:`trained_token_logprobs`), take the
PPO-clip loss against the samples' behaviour logprobs and advantages (:func:`micro_batch_loss`), and
backpropagate ``loss_sum / total_weight`` where the total weight is over the WHOLE batch
(:func:`total_loss_weight`), so that splitting the batch (into micro-batches or across ranks) sums to the
same gradient. :class:`StepSums` accumulates the metrics and turns them into the step's metrics dict.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields

import torch

from agentjet.algorithms.loss import PolicyLossOutput, ppo_clip_loss
from agentjet.engines.base import TrainSample
from agentjet.engines.logprobs import chunked_token_logprobs
from agentjet.settings import EngineSettings, LossSettings


@dataclass(frozen=True)
class StepConfig:
    """What one train step needs, taken from the settings (``engine`` and ``loss`` blocks and the learning
    rate): a plain, picklable value that a trainer group sends to its ranks. Not a settings object of its own:
    build it with ``from_settings``."""

    learning_rate: float
    weight_decay: float
    max_grad_norm: float
    clip_eps_low: float
    clip_eps_high: float
    kl_coef: float
    micro_batch_tokens: int
    logprob_chunk_tokens: int
    bf16: bool  # autocast the forward pass to bfloat16
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW's defaults

    @classmethod
    def from_settings(cls, engine: EngineSettings, loss: LossSettings, learning_rate: float) -> StepConfig:
        return cls(learning_rate=learning_rate, weight_decay=engine.weight_decay, max_grad_norm=engine.max_grad_norm,
                   clip_eps_low=loss.clip_eps_low, clip_eps_high=loss.clip_eps_high, kl_coef=loss.kl_coef,
                   micro_batch_tokens=engine.micro_batch_tokens, logprob_chunk_tokens=engine.logprob_chunk_tokens,
                   bf16=engine.autocast_bf16)


def total_loss_weight(batch: list[TrainSample]) -> float:
    """The normaliser of the step's loss: the sum of every trained token's weight over the whole batch."""
    return float(sum(s.weight * s.num_trained_tokens for s in batch))


def micro_batches(batch: list[TrainSample], max_tokens: int) -> list[list[TrainSample]]:
    """Samples sorted by length, cut into groups whose padded size (width x rows) stays within ``max_tokens``
    (a sample longer than that gets a group of its own)."""
    order = sorted(batch, key=lambda s: len(s.input_ids))
    groups: list[list[TrainSample]] = [[]]
    for s in order:
        width = max([len(s.input_ids)] + [len(x.input_ids) for x in groups[-1]])
        if groups[-1] and width * (len(groups[-1]) + 1) > max_tokens:
            groups.append([])
        groups[-1].append(s)
    return groups if groups[0] else []


@dataclass(frozen=True)
class PaddedBatch:
    """Right-padded tensors of a micro-batch: ids, attention mask, loss mask, per-token temperature."""

    ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    temperatures: torch.Tensor

    @property
    def predicted_mask(self) -> torch.Tensor:
        """Which positions ``t >= 1`` are trained, as a mask over ``[:, 1:]`` (token t is predicted at t - 1)."""
        return self.loss_mask[:, 1:]


def collate(samples: list[TrainSample], pad_id: int, device: torch.device | str = "cpu") -> PaddedBatch:
    width = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.bool)
    temps = torch.zeros((len(samples), width))
    for i, s in enumerate(samples):
        n = len(s.input_ids)
        ids[i, :n] = torch.tensor(s.input_ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.bool)
        temps[i, :n] = s.temperature
    return PaddedBatch(*(t.to(device) for t in (ids, attn, mask, temps)))


def trained_token_logprobs(
    decoder: torch.nn.Module,
    head_weight: torch.Tensor,
    batch: PaddedBatch,
    chunk_rows: int,
    bf16_autocast: bool = False,
) -> torch.Tensor:
    """Logprobs (at each sample's temperature) of every trained token, flattened row-major: the same order as
    :func:`token_targets`. ``decoder`` is the model without its head (``*ForCausalLM.base_model``)."""
    device_type = batch.ids.device.type
    autocast = torch.autocast(device_type, dtype=torch.bfloat16) if bf16_autocast else contextlib.nullcontext()
    with autocast:
        hidden = decoder(input_ids=batch.ids, attention_mask=batch.attention_mask).last_hidden_state
    pred = batch.predicted_mask
    h = hidden[:, :-1][pred]
    targets = batch.ids[:, 1:][pred]
    return chunked_token_logprobs(h, head_weight, targets, batch.temperatures[:, 1:][pred], chunk_rows)


def token_targets(samples: list[TrainSample], device: torch.device | str = "cpu"
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Behaviour logprobs, advantages and weights of every trained token, in the order of
    :func:`trained_token_logprobs` (row-major over the loss masks)."""
    flat = [(s, j) for s in samples for j, m in enumerate(s.loss_mask) if m]
    old = torch.tensor([s.behaviour_logprobs[j] for s, j in flat], device=device)
    adv = torch.tensor([s.advantages[j] for s, j in flat], device=device)
    w = torch.tensor([s.weight for s, _ in flat], device=device)
    return old, adv, w


def micro_batch_loss(logprobs: torch.Tensor, samples: list[TrainSample], config: StepConfig,
                     ref_logprobs: torch.Tensor | None = None) -> PolicyLossOutput:
    """The PPO-clip loss (a weighted sum, not yet normalised) of one micro-batch's trained tokens."""
    old, adv, w = token_targets(samples, logprobs.device)
    return ppo_clip_loss(logprobs, old, adv, w, config.clip_eps_low, config.clip_eps_high, ref_logprobs,
                         config.kl_coef)


@dataclass
class StepSums:
    """Metric sums over a step's micro-batches (and, summed across ranks, over a trainer group)."""

    loss: float = 0.0
    pg: float = 0.0
    kl: float = 0.0
    clipped: float = 0.0
    absdiff: float = 0.0
    tokens: float = 0.0
    ratio_max: float = 0.0  # a maximum, not a sum

    def add(self, res: PolicyLossOutput, n_tokens: int) -> None:
        self.loss += float(res.loss_sum.detach())
        self.pg += res.pg_sum
        self.kl += res.kl_sum
        self.clipped += res.clipped
        self.absdiff += res.abs_logprob_diff_sum
        self.tokens += n_tokens
        self.ratio_max = max(self.ratio_max, res.ratio_max)

    SUMMED = ("loss", "pg", "kl", "clipped", "absdiff", "tokens")

    def sums_tensor(self) -> torch.Tensor:
        """The summed fields as one float64 tensor (for an all-reduce with SUM)."""
        return torch.tensor([getattr(self, f) for f in self.SUMMED], dtype=torch.float64)

    @classmethod
    def from_reduced(cls, sums: torch.Tensor, ratio_max: float) -> StepSums:
        assert len(sums) == len(cls.SUMMED) and {f.name for f in fields(cls)} == {*cls.SUMMED, "ratio_max"}
        return cls(**dict(zip(cls.SUMMED, sums.tolist(), strict=True)), ratio_max=ratio_max)

    def metrics(self, total_weight: float) -> dict[str, float]:
        return {
            "loss": self.loss / total_weight,
            "pg_loss": self.pg / total_weight,
            "kl": self.kl / total_weight,
            "clip_frac": self.clipped / max(self.tokens, 1),
            "ratio_max": self.ratio_max,
            "mean_abs_logprob_diff": self.absdiff / max(self.tokens, 1),
            "trained_tokens": float(self.tokens),
        }
