"""The one policy-gradient train step, run by both learners: in process (``agentjet.learners.inprocess``) and
each rank of an FSDP2 trainer group (``agentjet.distributed.worker``). They differ only in how a micro-batch's
logprobs are computed (a plain module, or an FSDP root) and in how the sums are reduced (a no-op, or an
all-reduce); the loop, the clipping, the optimizer and the metric names live here once.

A step over a batch is: split it into micro-batches (:func:`micro_batch_indices`; a sequence is never split),
pad each one (:func:`collate`), compute the logprob of every trained token (:func:`trained_token_logprobs`), take
the configured objective (:func:`micro_batch_loss` -> ``algorithms.loss.policy_loss``: PPO-clip or CISPO, token or
sequence ratio, an aggregation, KL, mismatch correction) against the samples' behaviour logprobs and advantages,
and backpropagate ``loss_sum / Z`` where ``Z`` is over the WHOLE batch (:func:`total_loss_weight`), so that
splitting the batch (into micro-batches or across ranks) sums to the same gradient. :class:`StepSums` accumulates the metrics; :class:`PolicyOptimizer` clips and steps AdamW
(through fp32 master copies when the weights are in low precision). :func:`run_policy_step` is the loop.

Metric names (every learner reports these): ``loss``, ``pg_loss``, ``kl``, ``clip_frac``, ``ratio_max``,
``mean_abs_logprob_diff`` (mean |trainer - behaviour| logprob of the trained tokens before the update: the
train/sampler mismatch plus any staleness), ``mismatch_kl`` (k3, per token), ``is_masked_frac`` (tokens the
correction dropped), ``is_weight_mean`` (the correction's mean weight; 1 without one), ``trained_tokens``,
``grad_norm``, ``step_seconds`` (the loop, forward to optimizer step), ``samples``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from agentjet.algorithms.loss import PolicyLossOutput, policy_loss
from agentjet.algorithms.objectives import PolicyLossConfig, loss_normaliser
from agentjet.engines.base import TrainSample
from agentjet.engines.logprobs import LogprobKernels, chunked_token_logprobs
from agentjet.learners.masters import FlatMasters
from agentjet.settings import LearnerSettings, LossSettings


@dataclass(frozen=True)
class StepConfig:
    """What one train step needs, taken from the settings (``engine`` and ``loss`` blocks and the learning
    rate): a plain, picklable value that a trainer group sends to its ranks. Not a settings object of its own:
    build it with ``from_settings``."""

    learning_rate: float
    weight_decay: float
    max_grad_norm: float
    micro_batch_tokens: int | None  # None: the learner sizes it (agentjet.engines.memory)
    logprob_chunk_tokens: int
    bf16: bool  # autocast the forward pass to bfloat16
    loss: PolicyLossConfig = PolicyLossConfig()
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW's defaults
    # another engine samples than the one that trains (vLLM): ``loss.correction: auto`` resolves for that path
    separate_sampler: bool = False
    flat_masters: bool = False  # the fp32 masters in one buffer (``agentjet.learners.masters``)
    compile_logprobs: bool = False  # each logprob chunk's work through torch.compile (``engines.logprobs``)

    @classmethod
    def from_settings(cls, learner: LearnerSettings, loss: LossSettings, separate_sampler: bool = False) -> StepConfig:
        """``separate_sampler``: another engine samples than the one that trains (the vLLM generator)."""
        return cls(learning_rate=learner.learning_rate, weight_decay=learner.weight_decay,
                   max_grad_norm=learner.max_grad_norm, micro_batch_tokens=learner.micro_batch_tokens,
                   logprob_chunk_tokens=learner.logprob_chunk_tokens, bf16=learner.autocast_bf16,
                   loss=loss.policy_loss_config(separate_sampler), separate_sampler=separate_sampler,
                   flat_masters=learner.flat_masters, compile_logprobs=learner.compile_logprobs)

    @property
    def kl_coef(self) -> float:
        return self.loss.kl_coef

    def with_learning_rate(self, lr: float) -> StepConfig:
        """This config with a new learning rate (a live change: every learner applies it at its next step)."""
        import dataclasses

        if not lr > 0:
            raise ValueError("learning rate must be > 0")
        return dataclasses.replace(self, learning_rate=lr)

    def with_loss(self, loss: LossSettings) -> StepConfig:
        """This config with the live loss settings replaced."""
        import dataclasses

        return dataclasses.replace(self, loss=loss.policy_loss_config(self.separate_sampler))


def total_loss_weight(batch: list[TrainSample], loss: PolicyLossConfig | None = None) -> float:
    """``Z``, the normaliser of the step's loss over the WHOLE batch (``algorithms.objectives.loss_normaliser``):
    the weighted count of trained tokens (token mean, the default), of sequences (sequence mean), or of
    sequences times the constant (Dr. GRPO)."""
    return loss_normaliser([s.weight for s in batch], [s.num_trained_tokens for s in batch],
                           loss or PolicyLossConfig())


def micro_batch_indices(batch: Sequence[TrainSample], max_tokens: int) -> list[list[int]]:
    """Indices into ``batch``, sorted by sample length, cut into groups whose padded size (width x rows) stays
    within ``max_tokens`` (a sample longer than that gets a group of its own)."""
    order = sorted(range(len(batch)), key=lambda i: len(batch[i].input_ids))
    groups: list[list[int]] = [[]]
    width = 0
    for i in order:
        n = len(batch[i].input_ids)
        if groups[-1] and max(width, n) * (len(groups[-1]) + 1) > max_tokens:
            groups.append([])
            width = 0
        groups[-1].append(i)
        width = max(width, n)
    return groups if groups[0] else []


def micro_batches(batch: list[TrainSample], max_tokens: int) -> list[list[TrainSample]]:
    """:func:`micro_batch_indices` as the samples themselves."""
    return [[batch[i] for i in mb] for mb in micro_batch_indices(batch, max_tokens)]


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


def _padded(rows: Sequence[Sequence[Any]], width: int, fill: int | float, dtype: torch.dtype) -> torch.Tensor:
    """``rows`` right-padded with ``fill`` to ``width``, as one [len(rows), width] tensor made by one call (a
    tensor per row, written row by row, costs a dispatch per row and per field: milliseconds of host time per
    step that a GPU waits through, at 16 x 1,024 tokens)."""
    return torch.tensor([[*r, *[fill] * (width - len(r))] for r in rows], dtype=dtype)


def collate(samples: list[TrainSample], pad_id: int, device: torch.device | str = "cpu") -> PaddedBatch:
    width = max(len(s.input_ids) for s in samples)
    ids = _padded([s.input_ids for s in samples], width, pad_id, torch.long)
    valid = torch.arange(width)[None, :] < torch.tensor([len(s.input_ids) for s in samples])[:, None]
    mask = _padded([s.loss_mask for s in samples], width, 0, torch.bool)
    temps = torch.tensor([float(s.temperature) for s in samples], dtype=torch.float32)[:, None] * valid
    return PaddedBatch(*(t.to(device) for t in (ids, valid.long(), mask, temps)))


def trained_token_logprobs(
    decoder: torch.nn.Module,
    head_weight: torch.Tensor,
    batch: PaddedBatch,
    chunk_rows: int,
    bf16_autocast: bool = False,
    kernels: LogprobKernels | None = None,
) -> torch.Tensor:
    """Logprobs (at each sample's temperature) of every trained token, flattened row-major: the same order as
    :func:`token_targets`. ``decoder`` is the model without its head (``*ForCausalLM.base_model``); ``kernels``:
    the logprob chunks' work compiled (``StepConfig.compile_logprobs``), None for eager."""
    device_type = batch.ids.device.type
    autocast = torch.autocast(device_type, dtype=torch.bfloat16) if bf16_autocast else contextlib.nullcontext()
    with autocast:
        hidden = decoder(input_ids=batch.ids, attention_mask=batch.attention_mask).last_hidden_state
    pred = batch.predicted_mask
    h = hidden[:, :-1][pred]
    targets = batch.ids[:, 1:][pred]
    return chunked_token_logprobs(h, head_weight, targets, batch.temperatures[:, 1:][pred], chunk_rows, kernels)


def token_targets(samples: list[TrainSample], device: torch.device | str = "cpu"
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Behaviour logprobs, advantages, weights and sequence index (0 .. len(samples) - 1) of every trained token,
    in the order of :func:`trained_token_logprobs` (row-major over the loss masks): padded rows, selected by the
    loss mask in one call each (no Python loop over the tokens)."""
    width = max(len(s.loss_mask) for s in samples)
    mask = _padded([s.loss_mask for s in samples], width, 0, torch.bool)
    old = _padded([s.behaviour_logprobs for s in samples], width, 0.0, torch.float32).masked_select(mask)
    adv = _padded([s.advantages for s in samples], width, 0.0, torch.float32).masked_select(mask)
    w = torch.tensor([float(s.weight) for s in samples], dtype=torch.float32)[:, None].expand(-1, width)
    seq = torch.arange(len(samples))[:, None].expand(-1, width)
    return old.to(device), adv.to(device), w.masked_select(mask).to(device), seq.masked_select(mask).to(device)


def micro_batch_loss(logprobs: torch.Tensor, samples: list[TrainSample], config: StepConfig,
                     ref_logprobs: torch.Tensor | None = None) -> PolicyLossOutput:
    """The configured objective's loss (a sum, not yet normalised) over one micro-batch's trained tokens, with
    its mismatch sums. With a correction, the ratio is taken against the trainer's own detached logprobs (the
    proximal policy: this pass is the only one over the batch) and each token is weighted or masked on
    ``p_trainer / p_behaviour``."""
    behaviour, adv, w, seq = token_targets(samples, logprobs.device)
    return policy_loss(logprobs, behaviour, adv, w, seq, config.loss, ref_logprobs)


@dataclass
class StepSums:
    """Metric sums over a step's micro-batches (and, summed across ranks, over a trainer group)."""

    loss: float = 0.0
    pg: float = 0.0
    kl: float = 0.0
    clipped: float = 0.0
    absdiff: float = 0.0
    mismatch_kl: float = 0.0
    masked: float = 0.0
    is_weight: float = 0.0
    tokens: float = 0.0
    ratio_max: float = 0.0  # a maximum, not a sum

    def add(self, res: PolicyLossOutput, n_tokens: int) -> None:
        self.loss += res.loss_value
        self.pg += res.pg_sum
        self.kl += res.kl_sum
        self.clipped += res.clipped
        self.absdiff += res.abs_logprob_diff_sum
        self.mismatch_kl += res.mismatch_kl_sum
        self.masked += res.masked
        self.is_weight += res.is_weight_sum
        self.tokens += n_tokens
        self.ratio_max = max(self.ratio_max, res.ratio_max)

    SUMMED = ("loss", "pg", "kl", "clipped", "absdiff", "mismatch_kl", "masked", "is_weight", "tokens")

    def sums_tensor(self) -> torch.Tensor:
        """The summed fields as one float64 tensor (for an all-reduce with SUM)."""
        return torch.tensor([getattr(self, f) for f in self.SUMMED], dtype=torch.float64)

    @classmethod
    def from_reduced(cls, sums: torch.Tensor, ratio_max: float) -> StepSums:
        assert len(sums) == len(cls.SUMMED) and {f.name for f in fields(cls)} == {*cls.SUMMED, "ratio_max"}
        return cls(**dict(zip(cls.SUMMED, sums.tolist(), strict=True)), ratio_max=ratio_max)

    def metrics(self, total_weight: float) -> dict[str, float]:
        n = max(self.tokens, 1)
        return {
            "loss": self.loss / total_weight,
            "pg_loss": self.pg / total_weight,
            "kl": self.kl / total_weight,
            "clip_frac": self.clipped / n,
            "ratio_max": self.ratio_max,
            "mean_abs_logprob_diff": self.absdiff / n,
            "mismatch_kl": self.mismatch_kl / n,
            "is_masked_frac": self.masked / n,
            "is_weight_mean": self.is_weight / n if self.tokens else 1.0,
            "trained_tokens": float(self.tokens),
        }


class PolicyOptimizer:
    """AdamW over the trained parameters, built once from a :class:`StepConfig` whose learning rate, betas and
    weight decay are re-applied at every step (so live changes take effect at the next step). Weights in bf16 or
    fp16 get fp32 master copies that AdamW steps; the weights are then copied from them in place (stepped
    directly, bf16 weights round most small updates away: tests/learners/test_training_precision.py); with
    ``config.flat_masters`` the masters are views into one buffer that AdamW steps as one tensor
    (``agentjet.learners.masters``). Gradient clipping handles plain tensors and FSDP2's DTensors alike."""

    def __init__(self, params: list[torch.nn.Parameter], config: StepConfig) -> None:
        self.params = params
        low = any(p.dtype in (torch.bfloat16, torch.float16) for p in params)
        # plain tensors: the grads are cast and the weights copied back with one foreach call each, and on CUDA
        # AdamW runs fused (a step at 135M launches hundreds of small kernels otherwise); DTensors (FSDP2) keep
        # the per-tensor path
        self._foreach = all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in params)
        self.flat = FlatMasters(params) if low and config.flat_masters and self._foreach and params else None
        self.masters: list[torch.Tensor] = (self.flat.views if self.flat is not None else
                                            [p.detach().float().clone() for p in params] if low else [])
        stepped = [self.flat.flat] if self.flat is not None else self.masters or params
        fused = self._foreach and bool(stepped) and all(t.is_cuda for t in stepped)
        self.optimizer = torch.optim.AdamW(stepped, lr=config.learning_rate, betas=config.betas,
                                           weight_decay=config.weight_decay, fused=fused or None)

    def apply(self, config: StepConfig) -> None:
        for group in self.optimizer.param_groups:
            group.update(lr=config.learning_rate, betas=config.betas, weight_decay=config.weight_decay)

    def step(self, config: StepConfig) -> float:
        """Clip the gradients to ``config.max_grad_norm`` and step; returns the (total) gradient norm."""
        self.apply(config)
        stepped = [self.flat.flat] if self.flat is not None else self.masters or self.params
        if self.flat is not None:
            self.flat.take_grads()
        elif self.masters:
            self._grads_to_masters()
        grad_norm = torch.nn.utils.clip_grad_norm_(stepped, config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.masters:
            self._copy(self.params, self.masters)
        full = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        return float(full)

    def sync_masters(self) -> None:
        """The weights changed outside a step (a checkpoint was loaded): the masters follow."""
        if not self.masters:
            return
        self._copy(self.masters, self.params)

    def _grads_to_masters(self) -> None:
        """Each weight's low-precision grad, in fp32, becomes its master's grad; the weight's is dropped."""
        pairs: list[tuple[torch.nn.Parameter, torch.Tensor, torch.Tensor]] = []  # (weight, master, its grad)
        for p, m in zip(self.params, self.masters, strict=True):
            m.grad = None
            if p.grad is not None:
                pairs.append((p, m, p.grad))
        if self._foreach and pairs:
            grads = [torch.empty_like(m) for _, m, _ in pairs]
            torch._foreach_copy_(grads, [g for _, _, g in pairs])
        else:
            grads = [g.float() for _, _, g in pairs]
        for (p, m, _), g in zip(pairs, grads, strict=True):
            m.grad, p.grad = g, None

    def _copy(self, dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
        """``dst[i].copy_(src[i])`` (casting), in one foreach call where the tensors allow it."""
        with torch.no_grad():
            if self._foreach:
                torch._foreach_copy_(list(dst), list(src))
                return
            for d, s_ in zip(dst, src, strict=True):
                d.copy_(s_)

    def state_dict(self) -> dict[str, Any]:
        """AdamW's state (per weight, whichever way the masters are held) and the masters."""
        state = self.optimizer.state_dict()
        if self.flat is not None:
            state = self.flat.per_weight_state(state)
        return {"optimizer": state, "masters": self.masters} if self.masters else state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sync_masters()  # from the loaded weights, unless the state holds the exact masters
        if "masters" in state:
            with torch.no_grad():
                for m, saved in zip(self.masters, state["masters"], strict=False):
                    if saved.shape == m.shape:
                        m.copy_(saved)
            state = state["optimizer"]
        self.optimizer.load_state_dict(self.flat.flat_state(state) if self.flat is not None else state)


LogprobFn = Callable[[list[TrainSample]], torch.Tensor]


def run_policy_step(micro: Sequence[list[TrainSample]], *, forward: LogprobFn, reference: LogprobFn | None,
                    total_weight: float, config: StepConfig, optimizer: PolicyOptimizer,
                    reduce: Callable[[StepSums], StepSums] = lambda s: s, n_passes: int | None = None,
                    padding: list[TrainSample] | None = None) -> tuple[dict[str, float], list[list[list[float]]]]:
    """One policy-gradient step over this process's micro-batches: forward, loss, backward per micro-batch, then
    reduce the sums (a trainer group all-reduces them), clip and step. A trainer-group rank runs ``n_passes``
    passes in all (FSDP collectives must match across ranks), the extra ones over ``padding``, a zero-weight
    sample. Returns the metrics and, per micro-batch and sample, the trained tokens' logprobs the update used."""
    start = time.perf_counter()
    if total_weight <= 0:
        raise ValueError("train_step: the batch has no trained tokens (all loss masks are 0)")
    sums = StepSums()
    used: list[list[list[float]]] = []
    for i in range(n_passes if n_passes is not None else len(micro)):
        real = i < len(micro)
        mb = micro[i] if real else padding
        if mb is None:
            raise ValueError("run_policy_step: more passes than micro-batches and no padding sample")
        lp = forward(mb)
        ref = None
        if reference is not None and config.kl_coef > 0:
            with torch.no_grad():
                ref = reference(mb)
        res = micro_batch_loss(lp, mb, config, ref)
        (res.loss_sum / total_weight).backward()
        if real:
            sums.add(res, lp.numel())
            used.append([part.tolist() for part in lp.detach().float().split([s.num_trained_tokens for s in mb])])
    total = reduce(sums)
    grad_norm = optimizer.step(config)
    return {**total.metrics(total_weight), "grad_norm": grad_norm,
            "step_seconds": time.perf_counter() - start}, used
