"""Checkpoints of a run: save (the learner's weights and optimizer, plus the server's counters and the run's
settings), prune to ``keep_checkpoints``, pin the best one (``pin_best``: the checkpoint of the step whose held-out
eval was the best reported, kept whatever the pruning), and resume (load the latest, rewind the store to its
step). The layout on disk is ``agentjet.weights.checkpoints``."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agentjet.files import atomic_dir, write_atomic
from agentjet.runtime.clock import Clock
from agentjet.server.counters import TrainingCounters
from agentjet.server.store import TrainingStore
from agentjet.settings import ServerConfig
from agentjet.weights import checkpoints as layout

log = logging.getLogger(__name__)


class Persistent(Protocol):
    """What a checkpoint saves and loads: the learner's side of the engine."""

    @property
    def policy_version(self) -> int: ...

    def save(self, path: Path) -> None:
        """Fill ``path``: an empty directory (the checkpoint's temporary, renamed in when complete)."""

    def load(self, path: Path) -> None: ...


@dataclass(frozen=True)
class Pinned:
    """The answer to :meth:`Checkpoints.pin_best`: the run's best checkpoint after the call, its pin
    (``agentjet.weights.checkpoints.best``), and whether the call moved the pin there."""

    path: Path
    pin: dict[str, Any]
    moved: bool


class Checkpoints:
    def __init__(self, root: Path, engine: Persistent, store: TrainingStore, counters: TrainingCounters,
                 config: Callable[[], ServerConfig], clock: Clock) -> None:
        self.root = root
        self.engine = engine
        self.store = store
        self.counters = counters
        self._config = config
        self.clock = clock

    def save(self) -> Path:
        """A checkpoint of the committed step (call between steps). Written under a temporary name and renamed
        in whole; then the ``latest`` pointer moves and old ones are pruned."""
        config = self._config()
        step = self.counters.train_steps
        target = layout.step_dir(self.root, step)
        with atomic_dir(target) as tmp:
            self.engine.save(tmp)
            state = {**self.counters.checkpoint_state(), "policy_version": self.engine.policy_version,
                     "saved_at": self.clock.time()}
            (tmp / layout.SERVER_STATE).write_text(json.dumps(state, indent=2))
            run = {"model": config.model, "model_revision": config.model_revision,
                   "served_model_name": config.name, "settings": config.public_dict()}
            (tmp / layout.RUN_INFO).write_text(json.dumps(run, indent=2, default=str))
        write_atomic(self.root / layout.LATEST, target.name)  # a crash never leaves a torn pointer
        self._prune(config.training.keep_checkpoints)
        log.info("checkpoint saved: %s", target)
        return target

    def pin_best(self, eval_reward: float) -> Pinned:
        """Pin the committed step's checkpoint as the run's best when ``eval_reward`` (the held-out eval of this
        step's policy, reported by a client while training is paused) beats the pinned one's, writing that
        checkpoint if there is none of this step yet; else leave the pin. Monotone across clients and restarts: a
        restarted client's first, lower eval does not move it back."""
        current = layout.best(self.root)
        if current is not None and eval_reward <= float(current["eval"]):
            return Pinned(self.root / current["checkpoint"], current, moved=False)
        step = self.counters.train_steps
        target = layout.step_dir(self.root, step)
        if not layout.is_complete(target):  # the step's weights do not change until the next step
            target = self.save()
        pin = {"checkpoint": target.name, "eval": eval_reward, "train_steps": step,
               "policy_version": self.engine.policy_version, "pinned_at": self.clock.time()}
        write_atomic(self.root / layout.BEST, json.dumps(pin, indent=2))
        self._prune(self._config().training.keep_checkpoints)  # the one pinned before may go now
        log.info("checkpoint %s pinned as the best (eval %.4f)", target, eval_reward)
        return Pinned(target, pin, moved=True)

    def best(self) -> dict[str, Any] | None:
        return layout.best(self.root)

    def _prune(self, keep: int) -> None:
        pinned = layout.best(self.root)
        keep_name = pinned["checkpoint"] if pinned is not None else None
        for old in layout.step_dirs(self.root)[:-keep]:
            if old.name != keep_name:
                shutil.rmtree(old, ignore_errors=True)

    def latest(self) -> Path | None:
        return layout.latest(self.root)

    def resume(self) -> int:
        """Load the latest checkpoint (if any) and rewind the store to it. Returns the restored step."""
        ckpt = self.latest()
        step = 0
        if ckpt is not None:
            self.engine.load(ckpt)
            self.counters.restore(layout.read_json(ckpt / layout.SERVER_STATE))
            step = self.counters.train_steps
        rewound = self.store.rewind_to_step(step)
        log.info("resumed at step %d (checkpoint %s); %d episodes consumed after it are pending again", step,
                 ckpt, rewound)
        return step
