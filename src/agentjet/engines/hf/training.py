"""The embedded engine's training half: PPO-clip on precomputed per-token advantages, memory-bounded. The step is
built from ``engines/policy_step.py``, the pieces an FSDP2 trainer group's ranks use too.

``train_step`` runs the decoder over micro-batches of at most ``micro_batch_tokens`` padded tokens, gathers
only the trained positions and computes their logprobs a chunk of rows at a time
(``agentjet.engines.logprobs``), so full-vocabulary logits never exist for the whole batch; then PPO-clip
(+ optional k3 KL to a frozen reference), gradient clipping and AdamW. The weights are updated in place.

Weights in bf16 or fp16 (the default on CUDA) get fp32 master copies in the optimizer: AdamW steps the masters
and the weights are copied from them in place (stepped directly, bf16 weights round most small AdamW updates
away: tests/test_training_precision.py). The masters are optimizer state (saved with it); generation and
training still share the one copy of the weights.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch

from agentjet.engines.base import TrainSample
from agentjet.engines.policy_step import (
    StepConfig,
    StepSums,
    collate,
    micro_batch_loss,
    micro_batches,
    total_loss_weight,
    trained_token_logprobs,
)
from agentjet.settings import EngineSettings, LossSettings

OPTIMIZER_FILE = "optimizer.pt"


class PolicyTrainer:
    """Owns the optimizer; trains ``model`` (the engine's one copy of the weights) in place."""

    def __init__(self, model: torch.nn.Module, causal_lm: Any, pad_id: int, device: torch.device,
                 settings: EngineSettings, loss: LossSettings, learning_rate: float) -> None:
        self.model = model  # what is trained (a PEFT wrapper under LoRA)
        self.causal_lm = causal_lm  # the underlying *ForCausalLM: its decoder and output head
        self.pad_id = pad_id
        self.device = device
        self.settings = settings
        self.loss = loss
        self._reference: torch.nn.Module | None = None
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.low_precision = any(p.dtype in (torch.bfloat16, torch.float16) for p in self.params)
        # (weight, fp32 master) pairs when the weights are in low precision; the optimizer steps the masters.
        # Both are made at the first use, so an engine that only generates holds neither.
        self.masters: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        self._optimizer: torch.optim.Optimizer | None = None
        self._lr = learning_rate

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        if self._optimizer is None:
            if self.low_precision:
                self.masters = [(p, p.detach().float().clone()) for p in self.params]
            stepped = [m for _, m in self.masters] if self.masters else self.params
            self._optimizer = torch.optim.AdamW(stepped, lr=self._lr, weight_decay=self.settings.weight_decay)
        return self._optimizer

    @property
    def learning_rate(self) -> float:
        return self._lr

    def set_learning_rate(self, lr: float) -> None:
        if not lr > 0:
            raise ValueError("learning rate must be > 0")
        self._lr = lr
        if self._optimizer is not None:
            for group in self._optimizer.param_groups:
                group["lr"] = lr

    def _reference_model(self) -> torch.nn.Module:
        if self._reference is None:
            self._reference = copy.deepcopy(self.causal_lm).eval().requires_grad_(False)
        return self._reference

    def step_config(self) -> StepConfig:
        return StepConfig.from_settings(self.settings, self.loss, self.learning_rate)

    def forward_trained_logprobs(self, samples: list[TrainSample], model: Any | None = None) -> torch.Tensor:
        """Logprobs of every trained token (loss_mask == 1) in ``samples``, flattened in row-major order."""
        lm = model if model is not None else self.causal_lm
        batch = collate(samples, self.pad_id, self.device)
        return trained_token_logprobs(lm.base_model, lm.get_output_embeddings().weight, batch,
                                      self.settings.logprob_chunk_tokens, self.settings.autocast_bf16)

    def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        """One step: the same pieces as a trainer group's ranks (``engines/policy_step.py``)."""
        start = time.perf_counter()
        cfg = self.step_config()
        total_weight = total_loss_weight(batch)
        if total_weight <= 0:
            raise ValueError("train_step: the batch has no trained tokens (all loss masks are 0)")
        self.model.train()
        sums = StepSums()
        for mb in micro_batches(batch, cfg.micro_batch_tokens):
            lp = self.forward_trained_logprobs(mb)
            for s, part in zip(mb, lp.detach().float().split([s.num_trained_tokens for s in mb]), strict=True):
                s.trainer_logprobs = part.tolist()  # for the trace viewer
            ref = None
            if cfg.kl_coef > 0:
                with torch.no_grad():
                    ref = self.forward_trained_logprobs(mb, model=self._reference_model())
            res = micro_batch_loss(lp, mb, cfg, ref)
            (res.loss_sum / total_weight).backward()
            sums.add(res, lp.numel())
        grad_norm = self._step(cfg.max_grad_norm)
        self.model.eval()
        return {**sums.metrics(total_weight), "grad_norm": float(grad_norm), "samples": float(len(batch)),
                "step_seconds": time.perf_counter() - start}

    def _step(self, max_grad_norm: float) -> torch.Tensor:
        """Clip, AdamW, and (with masters) copy the stepped masters into the weights in place."""
        optimizer = self.optimizer
        if not self.masters:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return grad_norm
        for p, m in self.masters:
            m.grad = p.grad.float() if p.grad is not None else None
            p.grad = None
        grad_norm = torch.nn.utils.clip_grad_norm_([m for _, m in self.masters], max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, m in self.masters:
                p.copy_(m)
        return grad_norm

    def sync_masters(self) -> None:
        """The weights changed outside a train step (a checkpoint was loaded): the masters follow."""
        with torch.no_grad():
            for p, m in self.masters:
                m.copy_(p)

    @torch.no_grad()
    def score(self, samples: list[TrainSample]) -> list[list[float]]:
        """Current-policy logprobs of each sample's trained tokens (teacher forcing)."""
        self.model.eval()
        return [self.forward_trained_logprobs([s]).tolist() for s in samples]

    def save_optimizer(self, path: Path) -> None:
        state = self.optimizer.state_dict()
        if self.masters:
            state = {"optimizer": state, "masters": [m for _, m in self.masters]}
        torch.save(state, path / OPTIMIZER_FILE)

    def load_optimizer(self, path: Path) -> None:
        opt_file = path / OPTIMIZER_FILE
        if self._optimizer is None and not opt_file.exists():
            return  # made at the first step, from the loaded weights
        optimizer = self.optimizer
        self.sync_masters()  # from the loaded weights, unless the file holds the exact masters
        if not opt_file.exists():
            return
        state = torch.load(opt_file, map_location=self.device, weights_only=True)
        if "masters" in state:
            with torch.no_grad():
                for (_, m), saved in zip(self.masters, state["masters"], strict=False):
                    if saved.shape == m.shape:
                        m.copy_(saved)
            state = state["optimizer"]
        optimizer.load_state_dict(state)
