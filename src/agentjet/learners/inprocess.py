"""The in-process learner: PPO-clip on precomputed per-token advantages, memory-bounded, on one device, through
the one policy step (``learners/policy_step.py``).

``train_step`` runs the decoder over micro-batches of at most ``micro_batch_tokens`` padded tokens, gathers only
the trained positions and computes their logprobs a chunk of rows at a time (``agentjet.engines.logprobs``), so
full-vocabulary logits never exist for the whole batch; then the loss (+ optional k3 KL to a frozen reference),
gradient clipping and AdamW (through fp32 masters for bf16/fp16 weights). The weights are updated in place.

All torch work runs on one worker thread: the embedded generator's when the two share the module (its step then
runs between two decode steps), else a thread of its own.

One named LoRA adapter (``adapter=name``, ``layouts/adapters.py``): several learners share one PEFT module, one
per adapter. Each optimizes its adapter's parameters only, makes its adapter the active one before each step,
score, export and save (on the worker thread, so nothing runs between the switch and the work), and has its own
policy version. Its exports and checkpoints hold its adapter alone: ``export_adapter`` a standard PEFT adapter
directory, ``export_weights`` the base with only this adapter merged, ``save``/``load`` its adapter's weights,
its optimizer and its version. The KL reference is the frozen base itself (the adapters disabled), so no copy
of the model is made.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentjet.engines.base import Learner, StepOutput, TrainSample
from agentjet.engines.logprobs import LogprobKernels
from agentjet.engines.memory import auto_micro_batch_tokens
from agentjet.engines.model import PolicyModel, adapter_parameters, output_weight
from agentjet.engines.worker import EngineWorker
from agentjet.learners.policy_step import (
    PolicyOptimizer,
    StepConfig,
    collate,
    micro_batch_indices,
    run_policy_step,
    total_loss_weight,
    trained_token_logprobs,
)
from agentjet.learners.state_files import adapter_directory, load_checkpoint, merged_weights, save_checkpoint
from agentjet.settings import LearnerSettings, LossSettings
from agentjet.weights.io import prune_versions, version_dir


class InProcessLearner(Learner):
    """Trains ``policy.model`` in place. ``worker``: the thread its torch work runs on (the embedded generator's
    when they share the module); None gives it a thread of its own. ``adapter``: the named LoRA adapter it
    trains, alone, on a module built with named adapters (None: every trainable parameter)."""

    def __init__(self, policy: PolicyModel, settings: LearnerSettings, loss: LossSettings,
                 *, separate_sampler: bool = False, worker: EngineWorker | None = None, export_root: Path | None = None,
                 keep_exports: int = 2, on_version: Callable[[int], None] | None = None,
                 adapter: str | None = None, owns_export_root: bool = False) -> None:
        """``on_version(v)`` runs on the worker thread right after a step or a load moves the weights to version
        ``v``: a generator that shares the module serves the new version from its very next decode step.
        ``owns_export_root``: ``export_root`` was made for this learner and is removed at close (one it makes
        itself, when none is given, always is)."""
        self.policy = policy
        self.settings = settings
        self.adapter = adapter
        self.config = StepConfig.from_settings(settings, loss, separate_sampler)
        self._own_worker = worker is None
        self.worker = worker or EngineWorker(name="agentjet-learner")
        if adapter is not None and not policy.adapters:
            raise ValueError(f"adapter {adapter!r}: the model was not built with named LoRA adapters "
                             "(load_policy_model(..., adapters=[...]))")
        self.params = (adapter_parameters(policy.model, adapter) if adapter is not None
                       else [p for p in policy.model.parameters() if p.requires_grad])
        self._optimizer: PolicyOptimizer | None = None  # made at the first step: a generate-only run holds none
        # the logprob chunks through torch.compile (learner.compile_logprobs; compiled at the first step)
        self._kernels = LogprobKernels.compiled() if self.config.compile_logprobs else None
        # the KL reference: a frozen copy of the weights (a named adapter's is the base: no copy)
        self._reference = frozen_copy(policy.causal_lm) if self.config.kl_coef > 0 and adapter is None else None
        self.export_root = export_root
        self._on_version = on_version
        self._own_export_root: Path | None = export_root if owns_export_root else None
        self.keep_exports = keep_exports
        self.policy_version = 0
        # the micro-batch when the setting leaves it to the learner: sized from the device's free memory now
        self.micro_batch_tokens = self.config.micro_batch_tokens or auto_micro_batch_tokens(
            policy.causal_lm.config, policy.device, 2 if self.config.bf16 else policy.dtype.itemsize,
            policy.gradient_checkpointing)

    # ------------------------------------------------------------ settings
    @property
    def learning_rate(self) -> float:
        return self.config.learning_rate

    def set_learning_rate(self, lr: float) -> None:
        self.config = self.config.with_learning_rate(lr)

    def set_loss(self, loss: LossSettings) -> None:
        """From the next step. Turning the KL term on copies the reference from the weights at that moment (the
        initial weights only when it was on from the start: set it at start-up for that)."""
        self.config = self.config.with_loss(loss)

    @property
    def lora(self) -> Any:
        return self.policy.lora

    @property
    def optimizer(self) -> PolicyOptimizer:
        if self._optimizer is None:
            self._optimizer = PolicyOptimizer(self.params, self.config)
        return self._optimizer

    @property
    def has_optimizer(self) -> bool:
        """Whether a step made the optimizer (and its state) yet."""
        return self._optimizer is not None

    @property
    def masters(self) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
        """(weight, fp32 master) pairs when the weights are in low precision (empty before the first step)."""
        if self._optimizer is None:
            return []
        return list(zip(self._optimizer.params, self._optimizer.masters, strict=False))

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"learner": "in-process", "learning_rate": self.learning_rate,
                                "micro_batch_tokens": self.micro_batch_tokens}
        if self.adapter is not None:
            info["adapter"] = self.adapter
        return info

    def activate(self) -> None:
        """Make this learner's adapter the active one (on the worker thread, right before its work: its steps, the
        Tinker ops of ``tinker_ops``, its files): the forward without ``adapter_names`` runs it, and only its
        parameters require gradients. A no-op without one."""
        if self.adapter is None:
            return
        model = self.policy.model
        if self.adapter not in model.peft_config:
            raise ValueError(f"LoRA adapter {self.adapter!r} was removed: its learner cannot run "
                             f"(adapters: {sorted(model.peft_config)})")
        if model.active_adapters != [self.adapter]:
            model.set_adapter(self.adapter)

    # ------------------------------------------------------------ training
    def _logprobs(self, samples: list[TrainSample], lm: Any | None = None) -> torch.Tensor:
        """Logprobs of every trained token (loss_mask == 1) in ``samples``, flattened in row-major order."""
        lm = lm if lm is not None else self.policy.causal_lm
        batch = collate(samples, self.policy.pad_id, self.policy.device)
        return trained_token_logprobs(lm.base_model, output_weight(lm), batch,
                                      self.config.logprob_chunk_tokens, self.config.bf16, self._kernels)

    def _reference_logprobs(self, samples: list[TrainSample]) -> torch.Tensor:
        if self.adapter is not None:  # the frozen base: every adapter switched off for this forward
            with self.policy.model.disable_adapter():
                return self._logprobs(samples)
        if self._reference is None:
            self._reference = frozen_copy(self.policy.causal_lm)
        return self._logprobs(samples, self._reference)

    async def train_step(self, batch: list[TrainSample]) -> StepOutput:
        if not batch:
            raise ValueError("train_step needs at least one sample")
        return await self.worker.run(self._train, batch)

    def _train(self, batch: list[TrainSample]) -> StepOutput:
        self.activate()
        cfg = self.config
        groups = micro_batch_indices(batch, self.micro_batch_tokens)
        self.policy.model.train()
        try:
            metrics, used = run_policy_step(
                [[batch[i] for i in g] for g in groups], forward=self._logprobs,
                reference=self._reference_logprobs if cfg.kl_coef > 0 else None,
                total_weight=total_loss_weight(batch, cfg.loss), config=cfg, optimizer=self.optimizer)
        finally:
            self.policy.model.eval()
        trainer_logprobs: list[list[float]] = [[] for _ in batch]
        for g, parts in zip(groups, used, strict=True):
            for i, lps in zip(g, parts, strict=True):
                trainer_logprobs[i] = lps
        self.policy_version += 1
        if self._on_version is not None:
            self._on_version(self.policy_version)
        return StepOutput({**metrics, "samples": float(len(batch)), "policy_version": float(self.policy_version)},
                          trainer_logprobs)

    @torch.no_grad()
    def _score(self, samples: list[TrainSample]) -> list[list[float]]:
        self.activate()
        self.policy.model.eval()
        return [self._logprobs([s]).tolist() for s in samples]

    async def score(self, samples: list[TrainSample]) -> list[list[float]]:
        return await self.worker.run(self._score, samples)

    # ------------------------------------------------------------ weights out
    def _export_root(self) -> Path:
        if self.export_root is None:  # none was given: a temporary one, removed at shutdown
            import tempfile

            self.export_root = self._own_export_root = Path(tempfile.mkdtemp(prefix="agentjet-learner-export-"))
        return self.export_root

    async def export_weights(self, dtype: str | None = None) -> Path:
        root = self._export_root() / "weights"
        path = await self.worker.run(merged_weights, self.policy, self.adapter, self.activate,
                                     version_dir(root, self.policy_version), dtype)
        await asyncio.to_thread(prune_versions, root, self.keep_exports, {path})
        return path

    async def export_adapter(self) -> Path:
        """The LoRA adapter of the current version (PEFT layout), for a generator that loads adapters."""
        if self.lora is None:
            raise ValueError("export_adapter: this learner trains the full weights, not LoRA adapters")
        root = self._export_root() / "adapters"
        path = await self.worker.run(adapter_directory, self.policy, self.adapter, self.activate,
                                     version_dir(root, self.policy_version))
        await asyncio.to_thread(prune_versions, root, self.keep_exports, {path})
        return path

    # ------------------------------------------------------------ persistence (learners/state_files.py)
    def save(self, path: Path) -> None:
        state = {"policy_version": self.policy_version, "learner": self.settings.model_dump(mode="json"),
                 "source_model": str(self.policy.path), "adapter": self.adapter}
        self.worker.run_sync(lambda: save_checkpoint(self.policy, self.adapter, self.activate, self.optimizer, state,
                                                     Path(path)))

    def load(self, path: Path) -> None:
        """Load a checkpoint into the weights in place (on the learner's thread: between decode steps when the
        module is shared)."""
        def loaded() -> None:  # one piece of work on the worker thread: no decode step between the two
            self.policy_version = load_checkpoint(self.policy, self.adapter, self.activate, lambda: self.optimizer,
                                                  self.has_optimizer, Path(path))
            if self._on_version is not None:
                self._on_version(self.policy_version)

        self.worker.run_sync(loaded)

    async def close(self) -> None:
        """Stop the worker thread it owns and remove the temporary export root it made."""
        if self._own_worker:
            await asyncio.to_thread(self.worker.close)
        if self._own_export_root is not None:
            import shutil

            await asyncio.to_thread(shutil.rmtree, self._own_export_root, ignore_errors=True)


def frozen_copy(lm: torch.nn.Module) -> torch.nn.Module:
    """The KL reference: a frozen copy of the weights as they are now."""
    return copy.deepcopy(lm).eval().requires_grad_(False)
