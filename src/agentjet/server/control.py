"""The control plane (``/swarm/v1/control``, admin token): live settings, pause/resume, checkpoint, stop.

A settings change is validated as a whole before anything is applied, takes effect from the next
batch (training settings) or the next call (sampling defaults), and is logged with the policy version
at which it took effect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError

from agentjet.protocol import SWARM_PREFIX, ChangeRecord, ConfigChange
from agentjet.server.config import SamplingDefaults, TrainingSettings
from agentjet.server.core import SwarmServer
from agentjet.server.errors import bad_request
from agentjet.server.openai_api import bearer, server_of

log = logging.getLogger(__name__)
router = APIRouter(prefix=f"{SWARM_PREFIX}/control")


def apply_change(server: SwarmServer, change: ConfigChange) -> ChangeRecord:
    """Validate the whole change first; apply it only if every field is valid."""
    try:
        training = TrainingSettings.model_validate({**server.config.training.model_dump(), **change.training})
        sampling = SamplingDefaults.model_validate({**server.config.sampling.model_dump(), **change.sampling})
    except ValidationError as exc:
        errs = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise bad_request(f"invalid settings: {errs}", param="training") from exc
    if training.min_group_size > training.group_size:
        raise bad_request("min_group_size cannot exceed group_size", param="training.min_group_size")
    applied: dict[str, Any] = {}
    current = server.config.training
    for key in change.training:
        new = getattr(training, key)
        if getattr(current, key) != new:
            setattr(current, key, new)  # the trainer holds this same object: effective from the next batch
            applied[f"training.{key}"] = new
    if "learning_rate" in change.training:
        server.engine.set_learning_rate(training.learning_rate)
    if change.sampling:
        server.config.sampling = sampling
        applied.update({f"sampling.{k}": getattr(sampling, k) for k in change.sampling})
    record = ChangeRecord(at=time.time(), policy_version=server.engine.policy_version,
                          train_step=server.trainer.counters.train_steps, changes=applied)
    if applied:
        server.change_log.append(record)
        log.info("config change at policy v%d (step %d): %s", record.policy_version, record.train_step, applied)
    return record


def _admin(request: Request) -> SwarmServer:
    server = server_of(request)
    server.check_admin_token(bearer(request))
    return server


@router.get("/config")
async def get_config(request: Request) -> dict[str, Any]:
    server = _admin(request)
    return {"config": server.public_config(), "changes": [c.model_dump() for c in server.change_log]}


@router.post("/config", response_model=ChangeRecord)
async def set_config(request: Request, body: ConfigChange) -> ChangeRecord:
    server = _admin(request)
    async with server.trainer.step_lock:  # between train steps: a batch never mixes settings
        return apply_change(server, body)


@router.post("/pause")
async def pause(request: Request) -> dict[str, Any]:
    server = _admin(request)
    server.trainer.paused = True
    log.info("training paused at policy v%d", server.engine.policy_version)
    return {"paused": True, "policy_version": server.engine.policy_version}


@router.post("/resume")
async def resume(request: Request) -> dict[str, Any]:
    server = _admin(request)
    server.trainer.paused = False
    server.trainer.wake()
    log.info("training resumed at policy v%d", server.engine.policy_version)
    return {"paused": False, "policy_version": server.engine.policy_version}


@router.post("/checkpoint")
async def checkpoint(request: Request) -> dict[str, Any]:
    server = _admin(request)
    path = await server.trainer.checkpoint_now()
    return {"path": str(path), "train_step": server.trainer.counters.train_steps,
            "policy_version": server.engine.policy_version}


@router.post("/stop")
async def stop(request: Request) -> dict[str, Any]:
    """Checkpoint and shut the server down gracefully (the answer is sent first)."""
    server = _admin(request)
    if server.on_stop is None:
        raise bad_request("this server was not started with a stop handler", param=None)
    asyncio.get_running_loop().call_later(0.2, server.on_stop)
    return {"stopping": True, "policy_version": server.engine.policy_version}
