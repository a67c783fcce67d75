"""The trainer-group learner: an FSDP2 group (``agentjet.distributed.TrainerGroup``) behind the ``Learner``
interface. Its calls block on the ranks, so they run off the event loop (one at a time: the group serialises).

Checkpoints hold the group's sharded model and optimizer (``path/sharded``, loadable by a group of any size) and
the Hugging Face weights beside them, so the in-process learner can load them too; it loads a checkpoint of the
in-process learner (weights only, a fresh optimizer) as well.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

from agentjet.distributed.group import SHARDED_DIR, TrainerGroup
from agentjet.engines.base import Learner, StepOutput, TrainSample
from agentjet.engines.model import ModelFacts
from agentjet.settings import LossSettings
from agentjet.weights.checkpoints import LEARNER_STATE, read_policy_version
from agentjet.weights.io import WEIGHTS_FILE, untied_config


class GroupLearner(Learner):
    def __init__(self, group: TrainerGroup, facts: ModelFacts) -> None:
        self.group = group
        self.facts = facts  # the source model's: its config, generation config and tokenizer go beside exports
        self._loaded: Path | None = None  # a loaded checkpoint's weights: the newest until the next step

    @property
    def policy_version(self) -> int:  # type: ignore[override]
        return self.group.policy_version

    async def train_step(self, batch: list[TrainSample]) -> StepOutput:
        if not batch:
            raise ValueError("train_step needs at least one sample")
        return await asyncio.to_thread(self.group.train_step, batch)

    async def score(self, samples: list[TrainSample]) -> list[list[float]]:
        return await asyncio.to_thread(self.group.score, samples)

    async def export_weights(self, dtype: str | None = None) -> Path:
        """The directory of the latest step's export (rank 0 wrote its untied weights there), completed into a
        model directory. ``dtype`` is not applied: the ranks export fp32."""
        return await asyncio.to_thread(self._latest_export)

    def _latest_export(self) -> Path:
        weights = self.group.latest_weights
        if weights is not None:
            return self._complete_model_dir(weights.parent)
        if self._loaded is not None:
            return self._loaded
        raise RuntimeError("the trainer group holds its initial weights: there is no export before the first step")

    def _complete_model_dir(self, target: Path) -> Path:
        """Config (untied), generation config and tokenizer beside the weights, once per directory."""
        if (target / "config.json").exists():
            return target
        untied_config(self.facts.config).save_pretrained(target)
        if self.facts.generation_config is not None:
            self.facts.generation_config.save_pretrained(target)
        self.facts.tokenizer.save_pretrained(target)
        return target

    # ------------------------------------------------------------ persistence
    def save(self, path: Path) -> None:
        """The sharded state, plus the Hugging Face weights of the same version (for any other learner)."""
        path = Path(path)
        self.group.save(path)
        weights = self.group.latest_weights or (self._loaded / WEIGHTS_FILE if self._loaded is not None else None)
        if weights is not None and weights != path / WEIGHTS_FILE:
            shutil.copyfile(weights, path / WEIGHTS_FILE)
            self._complete_model_dir(path)
        (path / LEARNER_STATE).write_text(json.dumps({"policy_version": self.group.policy_version,
                                                   "source_model": str(self.group.model)}, indent=2))

    def load(self, path: Path) -> None:
        """A checkpoint of this learner (resharded to this group), or of the in-process learner (weights only;
        the optimizer starts fresh)."""
        path = Path(path)
        if (path / SHARDED_DIR).is_dir():
            self.group.load(path)
        else:
            self.group.load_hf_weights(path, read_policy_version(path))
        self.group.latest_weights = None  # older than what was loaded
        self._loaded = path if (path / WEIGHTS_FILE).exists() else None

    @property
    def learning_rate(self) -> float:
        return self.group.learning_rate

    def set_learning_rate(self, lr: float) -> None:
        self.group.set_learning_rate(lr)

    def set_loss(self, loss: LossSettings) -> None:
        self.group.set_loss(loss)

    def describe(self) -> dict[str, Any]:
        return {"learner": "trainer-group", "trainer_ranks": self.group.world_size,
                "learning_rate": self.learning_rate}

    async def close(self) -> None:
        await asyncio.to_thread(self.group.close)
