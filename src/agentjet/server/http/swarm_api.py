"""Swarm routes (``/swarm/v1``): join, begin, heartbeat, end, abort, team phases, status, trace."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request

from agentjet.protocol import (
    SWARM_PREFIX,
    AbortEpisodeRequest,
    AbortEpisodeResponse,
    BeginEpisodeRequest,
    BeginEpisodeResponse,
    EndEpisodeRequest,
    EndEpisodeResponse,
    HeartbeatResponse,
    JoinRequest,
    JoinResponse,
    PrepareEpisodeRequest,
    ServerStatus,
    TeamDecisionResponse,
)
from agentjet.server.errors import not_found
from agentjet.server.http.deps import bearer, require_swarm, require_swarm_or_admin, server_of

router = APIRouter(prefix=SWARM_PREFIX)


@router.post("/join", response_model=JoinResponse, dependencies=[Depends(require_swarm)])
async def join(request: Request, body: JoinRequest) -> JoinResponse:
    return server_of(request).episodes.join(body)


async def disconnected(request: Request) -> None:
    """Returns when the client of this request disconnects (its body is already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


@router.post("/episodes", response_model=BeginEpisodeResponse, dependencies=[Depends(require_swarm)])
async def begin_episode(request: Request, body: BeginEpisodeRequest) -> BeginEpisodeResponse:
    """Held beyond capacity until the group fits (a long poll; ``server/episodes/admission.py``)."""
    return await server_of(request).admission.begin(body, client_gone=lambda: disconnected(request))


@router.post("/episodes/{episode_id}/heartbeat", response_model=HeartbeatResponse)
async def heartbeat(request: Request, episode_id: str, key: str | None = Depends(bearer)) -> HeartbeatResponse:
    return server_of(request).episodes.heartbeat(key, episode_id)


@router.post("/episodes/{episode_id}/end", response_model=EndEpisodeResponse)
async def end_episode(request: Request, episode_id: str, body: EndEpisodeRequest,
                      key: str | None = Depends(bearer)) -> EndEpisodeResponse:
    return await server_of(request).ingest.end(key, episode_id, body)


@router.post("/episodes/{episode_id}/abort", response_model=AbortEpisodeResponse)
async def abort_episode(request: Request, episode_id: str, body: AbortEpisodeRequest | None = None,
                        key: str | None = Depends(bearer)) -> AbortEpisodeResponse:
    return await server_of(request).episodes.abort(key, episode_id, body.reason if body else "")


@router.post("/episodes/{episode_id}/prepare", response_model=EndEpisodeResponse)
async def prepare_episode(request: Request, episode_id: str, body: PrepareEpisodeRequest,
                          key: str | None = Depends(bearer)) -> EndEpisodeResponse:
    """Team episodes, phase one: durable but not trainable until commit."""
    return await server_of(request).ingest.prepare(key, episode_id, body)


@router.post("/episodes/{episode_id}/commit", response_model=EndEpisodeResponse)
async def commit_episode(request: Request, episode_id: str, key: str | None = Depends(bearer)) -> EndEpisodeResponse:
    """Team episodes, phase two."""
    return await server_of(request).ingest.commit(key, episode_id)


@router.get("/teams/{team_id}", response_model=TeamDecisionResponse)
async def team_decision(request: Request, team_id: str, secret: str | None = Depends(bearer)) -> TeamDecisionResponse:
    """The coordinator's decision for a team (authorised by the team secret)."""
    return server_of(request).teams.decision(team_id, secret)


@router.get("/status", response_model=ServerStatus, dependencies=[Depends(require_swarm_or_admin)])
async def status(request: Request) -> ServerStatus:
    return server_of(request).status()


@router.get("/episodes/{episode_id}/trace")
async def episode_trace(request: Request, episode_id: str, key: str | None = Depends(bearer)) -> dict[str, Any]:
    """Every sample's tokens, loss mask, behaviour logprobs, agent and call boundaries, plus merge and drift
    statistics. Needs the admin token, or the episode's own key."""
    server = server_of(request)
    await asyncio.to_thread(server.keys.authorize_trace, key, episode_id, server.auth.is_admin(key))
    trace = await asyncio.to_thread(server.observe.trace, episode_id)
    if trace is None:
        raise not_found(f"episode {episode_id} has no stored samples (unknown, still open, aborted or expired)")
    return trace
