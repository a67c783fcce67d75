"""The in-process learner: PPO-clip on precomputed per-token advantages, memory-bounded, on one device, through
the one policy step (``engines/policy_step.py``).

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
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentjet.engines.base import Learner, StepOutput, TrainSample
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
from agentjet.settings import LearnerSettings, LossSettings
from agentjet.weights.checkpoints import LEARNER_STATE, read_policy_version
from agentjet.weights.io import (
    ADAPTER_WEIGHTS_FILE,
    export_full,
    export_lora,
    export_merged_adapter,
    export_named_adapter,
    load_adapter_state,
    load_state_into,
    prune_versions,
    version_dir,
    write_adapter_files,
)

OPTIMIZER_FILE = "optimizer.pt"


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
        # the KL reference: a frozen copy of the weights (a named adapter's is the base: no copy)
        self._reference = self._frozen_copy() if self.config.kl_coef > 0 and adapter is None else None
        self.export_root = export_root
        self._on_version = on_version
        self._own_export_root: Path | None = export_root if owns_export_root else None
        self.keep_exports = keep_exports
        self.policy_version = 0
        self.micro_batch_tokens = self.config.micro_batch_tokens or self._auto_micro_batch_tokens()

    def _auto_micro_batch_tokens(self) -> int:
        """The micro-batch when the setting leaves it to the learner: sized from the device's free memory now."""
        width = 2 if self.config.bf16 else self.policy.dtype.itemsize
        return auto_micro_batch_tokens(self.policy.causal_lm.config, self.policy.device, width,
                                       self.policy.gradient_checkpointing)

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
        """On the worker thread: make this learner's adapter the active one (the Tinker ops, ``tinker_ops``)."""
        self._activate()

    def _activate(self) -> None:
        """Make this learner's adapter the active one (on the worker thread, right before its work): the forward
        without ``adapter_names`` runs it, and only its parameters require gradients. A no-op without one."""
        if self.adapter is None:
            return
        model = self.policy.model
        if self.adapter not in model.peft_config:
            raise ValueError(f"LoRA adapter {self.adapter!r} was removed: its learner cannot run "
                             f"(adapters: {sorted(model.peft_config)})")
        if model.active_adapters != [self.adapter]:
            model.set_adapter(self.adapter)

    # ------------------------------------------------------------ training
    def _frozen_copy(self) -> torch.nn.Module:
        return copy.deepcopy(self.policy.causal_lm).eval().requires_grad_(False)

    def _logprobs(self, samples: list[TrainSample], lm: Any | None = None) -> torch.Tensor:
        """Logprobs of every trained token (loss_mask == 1) in ``samples``, flattened in row-major order."""
        lm = lm if lm is not None else self.policy.causal_lm
        batch = collate(samples, self.policy.pad_id, self.policy.device)
        return trained_token_logprobs(lm.base_model, output_weight(lm), batch,
                                      self.config.logprob_chunk_tokens, self.config.bf16)

    def _reference_logprobs(self, samples: list[TrainSample]) -> torch.Tensor:
        if self.adapter is not None:  # the frozen base: every adapter switched off for this forward
            with self.policy.model.disable_adapter():
                return self._logprobs(samples)
        if self._reference is None:
            self._reference = self._frozen_copy()
        return self._logprobs(samples, self._reference)

    async def train_step(self, batch: list[TrainSample]) -> StepOutput:
        if not batch:
            raise ValueError("train_step needs at least one sample")
        return await self.worker.run(self._train, batch)

    def _train(self, batch: list[TrainSample]) -> StepOutput:
        self._activate()
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
        self._activate()
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
        path = await self.worker.run(self._export_full, version_dir(root, self.policy_version), dtype)
        await asyncio.to_thread(prune_versions, root, self.keep_exports, {path})
        return path

    def _export_full(self, target: Path, dtype: str | None) -> Path:
        """Full weights; under LoRA, a merged copy (the live module keeps its adapters); a named adapter's: the base
        with that adapter alone merged, computed without copying the module."""
        if self.adapter is not None:
            self._activate()  # fails clearly when the adapter was removed
            return export_merged_adapter(self.policy.causal_lm, self.adapter, self.policy.tokenizer, target, dtype)
        lm = self.policy.causal_lm if self.lora is None else copy.deepcopy(self.policy.model).merge_and_unload()
        return export_full(lm, self.policy.tokenizer, target, dtype)

    async def export_adapter(self) -> Path:
        """The LoRA adapter of the current version (PEFT layout), for a generator that loads adapters."""
        if self.lora is None:
            raise ValueError("export_adapter: this learner trains the full weights, not LoRA adapters")
        root = self._export_root() / "adapters"
        path = await self.worker.run(self._export_adapter, version_dir(root, self.policy_version))
        await asyncio.to_thread(prune_versions, root, self.keep_exports, {path})
        return path

    def _export_adapter(self, target: Path) -> Path:
        """The PEFT adapter directory: a named adapter's alone, else the module's (``save_pretrained``)."""
        if self.adapter is None:
            return export_lora(self.policy.model, target)
        self._activate()
        return export_named_adapter(self.policy.model, self.adapter, target)

    # ------------------------------------------------------------ persistence
    def save(self, path: Path) -> None:
        self.worker.run_sync(self._save, Path(path))

    def _save(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if self.adapter is not None:  # this adapter alone: another adapter's checkpoint is its own
            self._activate()
            write_adapter_files(self.policy.model, self.adapter, path)
        else:
            self.policy.model.save_pretrained(path, safe_serialization=True)
        self.policy.tokenizer.save_pretrained(path)
        torch.save(self.optimizer.state_dict(), path / OPTIMIZER_FILE)
        state = {"policy_version": self.policy_version, "learner": self.settings.model_dump(mode="json"),
                 "source_model": str(self.policy.path), "adapter": self.adapter}
        (path / LEARNER_STATE).write_text(json.dumps(state, indent=2))

    def load(self, path: Path) -> None:
        """Load a checkpoint into the weights in place (on the learner's thread: between decode steps when the
        module is shared)."""
        self.worker.run_sync(self._load, Path(path))

    def _load(self, path: Path) -> None:
        from safetensors.torch import load_file

        files = [path / ADAPTER_WEIGHTS_FILE] if self.adapter is not None else sorted(path.glob("*.safetensors"))
        if not files or not all(f.exists() for f in files):
            what = f"adapter weights ({ADAPTER_WEIGHTS_FILE})" if self.adapter is not None else ".safetensors weights"
            raise FileNotFoundError(f"no {what} in {path}")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f), device=str(self.policy.device)))
        if self.adapter is not None:
            self._activate()
            load_adapter_state(self.policy.model, self.adapter, state, path)
        elif self.lora is not None:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.policy.model, state)
        else:
            load_state_into(self.policy.model, state, path)
        opt_file = path / OPTIMIZER_FILE
        if self._optimizer is not None or opt_file.exists():
            if opt_file.exists():
                self.optimizer.load_state_dict(torch.load(opt_file, map_location=self.policy.device,
                                                          weights_only=True))
            else:
                self.optimizer.sync_masters()
        self.policy_version = read_policy_version(path)
        if self._on_version is not None:
            self._on_version(self.policy_version)

    async def close(self) -> None:
        """Stop the worker thread it owns and remove the temporary export root it made."""
        if self._own_worker:
            await asyncio.to_thread(self.worker.close)
        if self._own_export_root is not None:
            import shutil

            await asyncio.to_thread(shutil.rmtree, self._own_export_root, ignore_errors=True)
