"""The control plane's routes (``/swarm/v1/control``, admin token): live settings, pause/resume, checkpoint, stop.
Each parses, calls one operation of ``server/control_plane.py`` and renders."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request

from agentjet.protocol import (
    SWARM_PREFIX,
    AdapterChange,
    AddAdapterRequest,
    ChangeRecord,
    CheckpointRequest,
    CheckpointResult,
    ConfigChange,
    PauseRequest,
    PauseState,
)
from agentjet.server.errors import bad_request
from agentjet.server.http.deps import require_admin, server_of
from agentjet.server.views.run_state import versions

router = APIRouter(prefix=f"{SWARM_PREFIX}/control", dependencies=[Depends(require_admin)])


@router.get("/config")
async def get_config(request: Request) -> dict[str, Any]:
    server = server_of(request)
    return {"config": server.public_config(), "changes": [c.model_dump() for c in server.control.change_log]}


@router.post("/config", response_model=ChangeRecord)
async def set_config(request: Request, body: ConfigChange) -> ChangeRecord:
    return await server_of(request).control.change(body)


@router.post("/pause", response_model=PauseState)
async def pause(request: Request, body: PauseRequest | None = None) -> PauseState:
    """Training starts no new step; with ``wait_for_step``, the answer waits for a step in progress."""
    return await server_of(request).control.pause(wait_for_step=body is not None and body.wait_for_step)


@router.post("/resume", response_model=PauseState)
async def resume(request: Request) -> PauseState:
    return server_of(request).control.resume()


@router.post("/adapters", response_model=AdapterChange)
async def add_adapter(request: Request, body: AddAdapterRequest) -> AdapterChange:
    """Add a LoRA adapter (a server that hosts several): it serves its agent and trains from now on."""
    return await server_of(request).control.add_adapter(body)


@router.delete("/adapters/{name}", response_model=AdapterChange)
async def remove_adapter(request: Request, name: str) -> AdapterChange:
    """Remove a LoRA adapter: its agent is no longer served by it, and it trains no more."""
    return await server_of(request).control.remove_adapter(name)


@router.post("/checkpoint", response_model=CheckpointResult)
async def checkpoint(request: Request, body: CheckpointRequest | None = None) -> CheckpointResult:
    """A checkpoint of the committed step; with ``best_eval``, pin it as the run's best if that eval is the best
    reported (``ajet export RUN --best`` exports it)."""
    return await server_of(request).control.checkpoint(body or CheckpointRequest())


@router.post("/stop")
async def stop(request: Request) -> dict[str, Any]:
    """Checkpoint and shut the server down gracefully (the answer is sent first)."""
    server = server_of(request)
    if server.on_stop is None:
        raise bad_request("this server was not started with a stop handler", param=None)
    asyncio.get_running_loop().call_later(0.2, server.on_stop)
    return {"stopping": True, "policy_version": versions(server.run).served}
