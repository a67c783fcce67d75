"""The embedded engine's training half: PPO-clip on precomputed per-token advantages, memory-bounded. The step is
built from ``engines/policy_step.py``, the pieces an FSDP2 trainer group's ranks use too.

``train_step`` runs the decoder over micro-batches of at most ``micro_batch_tokens`` padded tokens, gathers
only the trained positions and computes their logprobs a chunk of rows at a time
(``agentjet.engines.logprobs``), so full-vocabulary logits never exist for the whole batch; then PPO-clip
(+ optional k3 KL to a frozen reference), gradient clipping and AdamW. The weights are updated in place.
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
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate,
                                           weight_decay=settings.weight_decay)

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def set_learning_rate(self, lr: float) -> None:
        if not lr > 0:
            raise ValueError("learning rate must be > 0")
        for group in self.optimizer.param_groups:
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
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        return {**sums.metrics(total_weight), "grad_norm": float(grad_norm), "samples": float(len(batch)),
                "step_seconds": time.perf_counter() - start}

    @torch.no_grad()
    def score(self, samples: list[TrainSample]) -> list[list[float]]:
        """Current-policy logprobs of each sample's trained tokens (teacher forcing)."""
        self.model.eval()
        return [self.forward_trained_logprobs([s]).tolist() for s in samples]

    def save_optimizer(self, path: Path) -> None:
        torch.save(self.optimizer.state_dict(), path / OPTIMIZER_FILE)

    def load_optimizer(self, path: Path) -> None:
        opt_file = path / OPTIMIZER_FILE
        if opt_file.exists():
            self.optimizer.load_state_dict(torch.load(opt_file, map_location=self.device, weights_only=True))
