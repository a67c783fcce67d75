"""The control plane (``/swarm/v1/control``, admin token): live settings, pause/resume, checkpoint, stop.

A settings change is validated together with the rest of the configuration (the same ``ServerConfig`` model,
cross-field rules included) before anything is applied; only settings marked live may change. It takes effect from the next batch (training and
loss settings) or the next call (sampling defaults), and is logged with the policy version at which it took
effect. A ``task_ratios`` change that would shut out task types that clients are running is refused unless
forced.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter, Depends, Request

from agentjet.protocol import SWARM_PREFIX, ChangeRecord, ConfigChange, PauseRequest, PauseState
from agentjet.server.errors import bad_request, conflict
from agentjet.server.routes import require_admin, server_of
from agentjet.server.swarm import SwarmServer
from agentjet.settings import ServerConfig, SettingsError, deep_merge, find_field, validate

log = logging.getLogger(__name__)
CHANGE_SECTIONS = ("learner", "training", "sampling", "loss")  # the sections of a ConfigChange
router = APIRouter(prefix=f"{SWARM_PREFIX}/control", dependencies=[Depends(require_admin)])


def active_task_types(server: SwarmServer) -> set[str]:
    """Task types that clients are running now: open episodes, or a begin within ``absent_after_s``."""
    now = server.clock.monotonic()
    recent = {t for t, at in server.trainer.last_begin.items()
              if now - at <= server.config.training.absent_after_s}
    return recent | {t for t, n in server.registry.open_by_type.items() if n > 0}


def shut_out(server: SwarmServer, ratios: dict[str, float]) -> list[str]:
    """The running task types that these ratios would refuse (absent) or starve (a ratio of 0)."""
    if not ratios:
        return []
    return sorted(t for t in active_task_types(server) if ratios.get(t, 0) <= 0)


def apply_change(server: SwarmServer, change: ConfigChange) -> ChangeRecord:
    """Validate the whole configuration with the change; apply it only if every field is valid."""
    sections = {name: getattr(change, name) for name in CHANGE_SECTIONS if getattr(change, name)}
    for name, fields in sections.items():
        for key in fields:
            try:
                field = find_field(f"{name}.{key}")
            except KeyError as exc:
                raise bad_request(f"invalid settings: {exc.args[0]}", param=name) from exc
            if not field.live:
                raise bad_request(f"invalid settings: {field.dotted} cannot change while the server runs (restart "
                                  "it with the new value)", param=field.dotted)
    try:
        new = validate(deep_merge(server.config.model_dump(), sections))
    except SettingsError as exc:
        raise bad_request(f"invalid settings: {exc}", param=next(iter(sections), None)) from exc
    if "task_ratios" in change.training and not change.force:
        refused = shut_out(server, new.training.task_ratios)
        if refused:
            raise conflict(f"task_ratios {new.training.task_ratios} would shut out task types that clients are "
                           f"running: {refused}; send force: true (ajet ctl set --force) to apply it anyway",
                           "task_types_shut_out")
    applied = _diff(server.config, new, sections)
    for name in sections:
        setattr(server.config, name, getattr(new, name))  # read afresh by the trainer for its next batch
    if "learner.learning_rate" in applied:
        server.engine.set_learning_rate(new.learner.learning_rate)
    if any(key.startswith("loss.") for key in applied):
        server.engine.set_loss(new.loss)
    if any(key.startswith("training.") for key in applied):
        server.admission.pump()  # a larger bound or batch may admit held begins at once
    record = ChangeRecord(at=server.clock.time(), policy_version=server.engine.policy_version,
                          train_step=server.trainer.counters.train_steps, changes=applied)
    if applied:
        server.change_log.append(record)
        log.info("config change at policy v%d (step %d): %s", record.policy_version, record.train_step, applied)
    return record


def _diff(old: ServerConfig, new: ServerConfig, sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, fields in sections.items():
        before, after = getattr(old, name).model_dump(mode="json"), getattr(new, name).model_dump(mode="json")
        out.update({f"{name}.{key}": after[key] for key in fields if before[key] != after[key]})
    return out


@router.get("/config")
async def get_config(request: Request) -> dict[str, Any]:
    server = server_of(request)
    return {"config": server.public_config(), "changes": [c.model_dump() for c in server.change_log]}


@router.post("/config", response_model=ChangeRecord)
async def set_config(request: Request, body: ConfigChange) -> ChangeRecord:
    server = server_of(request)
    async with server.trainer.step_lock:  # between train steps: a batch never mixes settings
        return apply_change(server, body)


def pause_state(server: SwarmServer) -> PauseState:
    return PauseState(paused=server.trainer.paused, policy_version=server.engine.policy_version,
                      train_steps=server.trainer.counters.train_steps)


@router.post("/pause", response_model=PauseState)
async def pause(request: Request, body: PauseRequest | None = None) -> PauseState:
    """Training starts no new step; with ``wait_for_step``, the answer waits for a step in progress."""
    server = server_of(request)
    await server.trainer.pause(wait_for_step=body is not None and body.wait_for_step)
    log.info("training paused at policy v%d", server.engine.policy_version)
    return pause_state(server)


@router.post("/resume", response_model=PauseState)
async def resume(request: Request) -> PauseState:
    server = server_of(request)
    server.trainer.resume()
    log.info("training resumed at policy v%d", server.engine.policy_version)
    return pause_state(server)


@router.post("/checkpoint")
async def checkpoint(request: Request) -> dict[str, Any]:
    server = server_of(request)
    path = await server.trainer.checkpoint_now()
    return {"path": str(path), "train_step": server.trainer.counters.train_steps,
            "policy_version": server.engine.policy_version}


@router.post("/stop")
async def stop(request: Request) -> dict[str, Any]:
    """Checkpoint and shut the server down gracefully (the answer is sent first)."""
    server = server_of(request)
    if server.on_stop is None:
        raise bad_request("this server was not started with a stop handler", param=None)
    asyncio.get_running_loop().call_later(0.2, server.on_stop)
    return {"stopping": True, "policy_version": server.engine.policy_version}
