"""The embedded engine's training half: PPO-clip on precomputed per-token advantages, memory-bounded.

``train_step`` runs the decoder over micro-batches of at most ``micro_batch_tokens`` padded tokens, gathers
only the trained positions and computes their logprobs a chunk of rows at a time
(``agentjet.engines.logprobs``), so full-vocabulary logits never exist for the whole batch; then PPO-clip
(+ optional k3 KL to a frozen reference), gradient clipping and AdamW. The weights are updated in place.

Weights in bf16 or fp16 (the default on CUDA) get fp32 master copies in the optimizer: AdamW steps the masters
and the weights are copied from them in place. Stepping bf16 weights directly loses most updates: at lr 2e-5,
one AdamW step on SmolLM2-135M in bf16 changes 4 % of the weights, the rest round back to where they were
(docs/benchmarks.md). The masters are optimizer state (saved with it); generation and training still share the
one copy of the weights.
"""

from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path
from typing import Any

import torch

from agentjet.algorithms.loss import ppo_clip_loss
from agentjet.engines.base import TrainSample
from agentjet.engines.logprobs import chunked_token_logprobs
from agentjet.settings import EngineSettings, LossSettings

OPTIMIZER_FILE = "optimizer.pt"


def micro_batches(batch: list[TrainSample], max_tokens: int) -> list[list[TrainSample]]:
    """Length-sorted groups whose padded size (rows x longest row) stays within ``max_tokens``."""
    order = sorted(batch, key=lambda s: len(s.input_ids))
    groups: list[list[TrainSample]] = [[]]
    for s in order:
        width = max([len(s.input_ids)] + [len(x.input_ids) for x in groups[-1]])
        if groups[-1] and width * (len(groups[-1]) + 1) > max_tokens:
            groups.append([])
        groups[-1].append(s)
    return groups


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

    def forward_trained_logprobs(self, samples: list[TrainSample], model: Any | None = None) -> torch.Tensor:
        """Logprobs of every trained token (loss_mask == 1) in ``samples``, flattened in row-major order."""
        lm = model if model is not None else self.causal_lm
        decoder, head = lm.base_model, lm.get_output_embeddings().weight
        width = max(len(s.input_ids) for s in samples)
        ids = torch.full((len(samples), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(samples), width), dtype=torch.long)
        mask = torch.zeros((len(samples), width), dtype=torch.bool)
        temps = torch.zeros((len(samples), width))
        for i, s in enumerate(samples):
            n = len(s.input_ids)
            ids[i, :n] = torch.tensor(s.input_ids)
            attn[i, :n] = 1
            mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.bool)
            temps[i, :n] = s.temperature
        ids, attn, mask, temps = (t.to(self.device) for t in (ids, attn, mask, temps))
        autocast = (torch.autocast(self.device.type, dtype=torch.bfloat16) if self.settings.autocast_bf16
                    else contextlib.nullcontext())
        with autocast:
            hidden = decoder(input_ids=ids, attention_mask=attn).last_hidden_state
        pred_mask = mask[:, 1:]  # token t is predicted from the hidden state at t - 1
        h = hidden[:, :-1][pred_mask]
        targets = ids[:, 1:][pred_mask]
        return chunked_token_logprobs(h, head, targets, temps[:, 1:][pred_mask], self.settings.logprob_chunk_tokens)

    def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        start = time.perf_counter()
        loss_cfg = self.loss
        total_weight = sum(s.weight * s.num_trained_tokens for s in batch)
        if total_weight <= 0:
            raise ValueError("train_step: the batch has no trained tokens (all loss masks are 0)")
        self.model.train()
        sums = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "clipped": 0.0, "absdiff": 0.0, "ratio_max": 0.0}
        n_tokens = 0
        for mb in micro_batches(batch, self.settings.micro_batch_tokens):
            lp = self.forward_trained_logprobs(mb)
            flat = [(s, j) for s in mb for j, m in enumerate(s.loss_mask) if m]
            old = torch.tensor([s.behaviour_logprobs[j] for s, j in flat], device=self.device)
            adv = torch.tensor([s.advantages[j] for s, j in flat], device=self.device)
            w = torch.tensor([s.weight for s, _ in flat], device=self.device)
            ref = None
            if loss_cfg.kl_coef > 0:
                with torch.no_grad():
                    ref = self.forward_trained_logprobs(mb, model=self._reference_model())
            res = ppo_clip_loss(lp, old, adv, w, loss_cfg.clip_eps_low, loss_cfg.clip_eps_high, ref, loss_cfg.kl_coef)
            (res.loss_sum / total_weight).backward()
            sums["loss"] += float(res.loss_sum.detach())
            sums["pg"] += res.pg_sum
            sums["kl"] += res.kl_sum
            sums["clipped"] += res.clipped
            sums["absdiff"] += res.abs_logprob_diff_sum
            sums["ratio_max"] = max(sums["ratio_max"], res.ratio_max)
            n_tokens += len(flat)
        grad_norm = self._step()
        self.model.eval()
        return {
            "loss": sums["loss"] / total_weight,
            "pg_loss": sums["pg"] / total_weight,
            "kl": sums["kl"] / total_weight,
            "clip_frac": sums["clipped"] / max(n_tokens, 1),
            "ratio_max": sums["ratio_max"],
            "mean_abs_logprob_diff": sums["absdiff"] / max(n_tokens, 1),
            "grad_norm": float(grad_norm),
            "trained_tokens": float(n_tokens),
            "samples": float(len(batch)),
            "step_seconds": time.perf_counter() - start,
        }

    def _step(self) -> torch.Tensor:
        """Clip, AdamW, and (with masters) copy the stepped masters into the weights in place."""
        optimizer = self.optimizer
        if not self.masters:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.settings.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return grad_norm
        for p, m in self.masters:
            m.grad = p.grad.float() if p.grad is not None else None
            p.grad = None
        grad_norm = torch.nn.utils.clip_grad_norm_([m for _, m in self.masters], self.settings.max_grad_norm)
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
