"""An Engine for the swarm server: the embedded engine generates, a trainer group trains.

After each step the group's exported weights are copied into the embedded engine's model in place, on its
torch thread (between generation batches), and its policy version moves with them: rollouts keep being served
at the previous version until the copy is done, and during a trainer-group restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from agentjet.distributed.group import SHARDED_DIR, TrainerGroup
from agentjet.distributed.weights import copy_weights_into
from agentjet.engines.base import (
    Engine,
    GenerationResult,
    SamplingParams,
    TokenCallback,
    TrainSample,
)
from agentjet.engines.hf import STATE_FILE, HFEngine
from agentjet.engines.policy_step import StepConfig
from agentjet.settings import ServerConfig

log = logging.getLogger(__name__)


class GroupEngine(Engine):
    def __init__(self, rollout: HFEngine, group: TrainerGroup) -> None:
        if rollout.lora is not None:
            raise ValueError("a trainer group trains the full weights; it cannot serve a LoRA rollout engine")
        self.rollout = rollout
        self.group = group
        self.stats = {"weight_syncs": 0, "weight_sync_failures": 0}

    @property
    def tokenizer(self) -> Any:
        return self.rollout.tokenizer

    @property
    def max_context(self) -> int:
        return self.rollout.max_context

    @property
    def policy_version(self) -> int:  # type: ignore[override]
        """The trainer's version (what the next checkpoint holds); rollouts record the version they were
        generated with (the embedded engine's)."""
        return self.group.policy_version

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None) -> GenerationResult:
        return await self.rollout.generate(prompt_ids, sampling, on_token)

    async def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        if self.rollout.policy_version != self.group.policy_version:
            await self.sync_weights()  # a failed sync after the previous step: try again before training
        metrics = await asyncio.to_thread(self.group.train_step, batch)
        start = time.perf_counter()
        try:
            await self.sync_weights()
        except Exception:  # the step is committed: report it, serve the old weights, retry the copy next step
            self.stats["weight_sync_failures"] += 1
            log.exception("copying the new weights into the rollout engine failed; it serves v%d until the next "
                          "step", self.rollout.policy_version)
        metrics["weight_load_seconds"] = time.perf_counter() - start
        metrics["rollout_policy_version"] = float(self.rollout.policy_version)
        return metrics

    async def sync_weights(self) -> None:
        path, version = self.group.latest_weights, self.group.policy_version
        if path is None or self.rollout.policy_version == version:
            return

        def swap() -> None:
            copy_weights_into(self.rollout.model, path)
            self.rollout.policy_version = version

        await self.rollout.run_exclusive(swap)
        self.stats["weight_syncs"] += 1

    def save(self, path: Path) -> None:
        """The Hugging Face weights (from the rollout engine, which holds the trained ones) and the group's
        sharded model + optimizer state (``path/sharded``)."""
        if self.rollout.policy_version != self.group.policy_version:
            raise RuntimeError(f"the rollout engine holds v{self.rollout.policy_version}, the trainer "
                               f"v{self.group.policy_version}: not saving a checkpoint that disagrees with itself")
        self.rollout.save(path)
        self.group.save(path)

    def load(self, path: Path) -> None:
        """A checkpoint of this engine, or of the single-process engine (weights only; fresh optimizer)."""
        path = Path(path)
        if (path / SHARDED_DIR).is_dir():
            self.group.load(path)
        else:
            state = path / STATE_FILE
            version = int(json.loads(state.read_text())["policy_version"]) if state.exists() else 0
            self.group.load_hf_weights(path, version)
        self.rollout.load(path)
        self.rollout.policy_version = self.group.policy_version

    def set_learning_rate(self, lr: float) -> None:
        self.group.set_learning_rate(lr)
        self.rollout.set_learning_rate(lr)

    def set_loss(self, loss: Any) -> None:
        self.group.set_loss(loss.clip_eps_low, loss.clip_eps_high, loss.kl_coef)
        self.rollout.set_loss(loss)

    def describe(self) -> dict[str, Any]:
        return {**self.rollout.describe(), "kind": "hf+trainer-group", "trainer_ranks": self.group.world_size}

    async def close(self) -> None:
        await self.rollout.close()
        await asyncio.to_thread(self.group.close)


def build_group_engine(config: ServerConfig) -> GroupEngine:
    """The embedded engine for rollouts (the ``engine`` block) plus a started trainer group (the ``trainer``
    block; its work files under the data dir unless it names a work dir)."""
    settings = config.trainer
    if settings.work_dir is None and config.data_dir is not None:
        settings = settings.model_copy(update={"work_dir": Path(config.data_dir) / "trainer-group"})
    rollout = HFEngine(config.model, config.engine, config.loss, config.training.learning_rate)
    group = TrainerGroup(config.model, settings,
                         StepConfig.from_settings(config.engine, config.loss, config.training.learning_rate))
    group.start()
    return GroupEngine(rollout, group)
