"""The control plane's operations (the admin routes in ``server/http/control.py`` call them): live settings
changes, pause and resume, a checkpoint now.

A settings change is validated together with the rest of the configuration (the same ``ServerConfig`` model,
cross-field rules included) before anything is applied; only settings marked live may change. It takes effect
from the next batch (training, learner and loss settings) or the next call (sampling defaults), and is logged
with the policy version at which it took effect. A ``task_ratios`` change that would shut out task types that clients are running is refused unless
forced.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from agentjet.engines.base import Engine
from agentjet.protocol import (
    AdapterChange,
    AddAdapterRequest,
    BestCheckpoint,
    ChangeRecord,
    CheckpointRequest,
    CheckpointResult,
    ConfigChange,
    PauseState,
)
from agentjet.runtime.clock import Clock
from agentjet.server.counters import TrainingCounters
from agentjet.server.episodes.admission import Admission
from agentjet.server.episodes.registry import EpisodeRegistry
from agentjet.server.errors import bad_request, conflict
from agentjet.server.training.adapter_lanes import AdapterLanes
from agentjet.server.training.loop import TrainLoop
from agentjet.server.training.pool import GroupPool
from agentjet.settings import ServerConfig, SettingsError, deep_merge, find_field, validate

log = logging.getLogger(__name__)
CHANGE_SECTIONS = ("learner", "training", "sampling", "loss")  # the sections of a ConfigChange


class ControlPlane:
    def __init__(self, config: ServerConfig, engine: Engine, registry: EpisodeRegistry, pool: GroupPool,
                 loop: TrainLoop, admission: Admission, counters: TrainingCounters, clock: Clock) -> None:
        self.config = config  # the server's own: changes are applied to it in place
        self.engine = engine
        self.registry = registry
        self.pool = pool
        self.loop = loop
        self.admission = admission
        self.counters = counters
        self.clock = clock
        self.change_log: list[ChangeRecord] = []  # live config changes, with the version they took effect at
        self.adapters: AdapterLanes | None = None  # a server with several LoRA adapters: add and remove them

    # ------------------------------------------------------------ settings
    async def change(self, change: ConfigChange) -> ChangeRecord:
        """Apply ``change`` between train steps: a batch never mixes settings."""
        async with self.loop.step_lock:
            return self.apply_change(change)

    def active_task_types(self) -> set[str]:
        """Task types that clients are running now: open episodes, or a begin within ``absent_after_s``."""
        now = self.clock.monotonic()
        recent = {t for t, at in self.pool.last_begin.items() if now - at <= self.config.training.absent_after_s}
        return recent | {t for t, n in self.registry.open_by_type.items() if n > 0}

    def shut_out(self, ratios: dict[str, float]) -> list[str]:
        """The running task types that these ratios would refuse (absent) or starve (a ratio of 0)."""
        if not ratios:
            return []
        return sorted(t for t in self.active_task_types() if ratios.get(t, 0) <= 0)

    def apply_change(self, change: ConfigChange) -> ChangeRecord:
        """Validate the whole configuration with the change; apply it only if every field is valid."""
        sections = {name: getattr(change, name) for name in CHANGE_SECTIONS if getattr(change, name)}
        for name, fields in sections.items():
            for key in fields:
                try:
                    field = find_field(f"{name}.{key}")
                except KeyError as exc:
                    raise bad_request(f"invalid settings: {exc.args[0]}", param=name) from exc
                if not field.live:
                    raise bad_request(f"invalid settings: {field.dotted} cannot change while the server runs "
                                      "(restart it with the new value)", param=field.dotted)
        try:
            new = validate(deep_merge(self.config.model_dump(), sections))
        except SettingsError as exc:
            raise bad_request(f"invalid settings: {exc}", param=next(iter(sections), None)) from exc
        if "task_ratios" in change.training and not change.force:
            refused = self.shut_out(new.training.task_ratios)
            if refused:
                raise conflict(f"task_ratios {new.training.task_ratios} would shut out task types that clients are "
                               f"running: {refused}; send force: true (ajet ctl set --force) to apply it anyway",
                               "task_types_shut_out")
        applied = _diff(self.config, new, sections)
        for name in sections:
            setattr(self.config, name, getattr(new, name))  # read afresh by the training core for its next batch
        for lane in list(self.loop.lanes):  # every adapter's learner (one on a server with one policy)
            if "learner.learning_rate" in applied:
                lane.engine.set_learning_rate(new.learner.learning_rate)
            if any(key.startswith("loss.") for key in applied):
                lane.engine.set_loss(new.loss)
        if any(key.startswith("training.") for key in applied):
            self.admission.pump()  # a larger bound or batch may admit held begins at once
        record = ChangeRecord(at=self.clock.time(), policy_version=self.engine.policy_version,
                              train_step=self.counters.train_steps, changes=applied)
        if applied:
            self.change_log.append(record)
            log.info("config change at policy v%d (step %d): %s", record.policy_version, record.train_step, applied)
        return record

    # ------------------------------------------------------------ training
    def pause_state(self) -> PauseState:
        return PauseState(paused=self.loop.paused,
                          policy_version=self.counters.served_version(self.engine.generator_version),
                          train_steps=self.counters.train_steps)

    async def pause(self, wait_for_step: bool) -> PauseState:
        """Training starts no new step; with ``wait_for_step``, return after a step in progress."""
        await self.loop.pause(wait_for_step=wait_for_step)
        log.info("training paused at policy v%d", self.engine.policy_version)
        return self.pause_state()

    def resume(self) -> PauseState:
        self.loop.resume()
        log.info("training resumed at policy v%d", self.engine.policy_version)
        return self.pause_state()

    # ------------------------------------------------------------ adapters
    async def add_adapter(self, req: AddAdapterRequest) -> AdapterChange:
        lanes = self._adapter_lanes()
        await lanes.add(req.name, req.rank)
        return AdapterChange(adapters=lanes.names(), added=req.name)

    async def remove_adapter(self, name: str) -> AdapterChange:
        lanes = self._adapter_lanes()
        await lanes.remove(name)
        return AdapterChange(adapters=lanes.names(), removed=name)

    def _adapter_lanes(self) -> AdapterLanes:
        if self.adapters is None:
            raise bad_request("this server trains one policy, not LoRA adapters: start it with --lora-rank N "
                              "--adapters a,b to add and remove adapters", param="name")
        return self.adapters

    async def checkpoint(self, req: CheckpointRequest) -> CheckpointResult:
        """A checkpoint now, or with ``best_eval`` the best pin moved here when that eval beats the pinned one."""
        if req.best_eval is None:
            path: Path = await self.loop.checkpoint_now()
            pin, moved = self.loop.lanes[0].checkpoints.best(), False
        else:
            pinned = await self.loop.pin_best(req.best_eval)
            path, pin, moved = pinned.path, pinned.pin, pinned.moved
        best = None if pin is None else BestCheckpoint(
            path=str(path.parent / pin["checkpoint"]), eval=pin["eval"], train_steps=pin["train_steps"],
            policy_version=pin["policy_version"])
        return CheckpointResult(path=str(path), train_step=self.counters.train_steps,
                                policy_version=self.engine.policy_version, best=best, pinned=moved)


def _diff(old: ServerConfig, new: ServerConfig, sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, fields in sections.items():
        before, after = getattr(old, name).model_dump(mode="json"), getattr(new, name).model_dump(mode="json")
        out.update({f"{name}.{key}": after[key] for key in fields if before[key] != after[key]})
    return out
