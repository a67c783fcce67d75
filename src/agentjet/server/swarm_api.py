"""Swarm routes (``/swarm/v1``): join, begin, heartbeat, end, abort, status."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

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
from agentjet.server.errors import unauthorized
from agentjet.server.openai_api import bearer, server_of

router = APIRouter(prefix=SWARM_PREFIX)


@router.post("/join", response_model=JoinResponse)
async def join(request: Request, body: JoinRequest) -> JoinResponse:
    server = server_of(request)
    server.check_swarm_token(bearer(request))
    return server.join(body)


@router.post("/episodes", response_model=BeginEpisodeResponse)
async def begin_episode(request: Request, body: BeginEpisodeRequest) -> BeginEpisodeResponse:
    server = server_of(request)
    server.check_swarm_token(bearer(request))
    return server.begin(body)


@router.post("/episodes/{episode_id}/heartbeat", response_model=HeartbeatResponse)
async def heartbeat(request: Request, episode_id: str) -> HeartbeatResponse:
    return server_of(request).heartbeat(bearer(request), episode_id)


@router.post("/episodes/{episode_id}/end", response_model=EndEpisodeResponse)
async def end_episode(request: Request, episode_id: str, body: EndEpisodeRequest) -> EndEpisodeResponse:
    return await server_of(request).end(bearer(request), episode_id, body)


@router.post("/episodes/{episode_id}/abort", response_model=AbortEpisodeResponse)
async def abort_episode(request: Request, episode_id: str, body: AbortEpisodeRequest | None = None
                        ) -> AbortEpisodeResponse:
    return await server_of(request).abort(bearer(request), episode_id, body.reason if body else "")


@router.post("/episodes/{episode_id}/prepare", response_model=EndEpisodeResponse)
async def prepare_episode(request: Request, episode_id: str, body: PrepareEpisodeRequest) -> EndEpisodeResponse:
    """Team episodes, phase one: durable but not trainable until commit."""
    return await server_of(request).prepare(bearer(request), episode_id, body)


@router.post("/episodes/{episode_id}/commit", response_model=EndEpisodeResponse)
async def commit_episode(request: Request, episode_id: str) -> EndEpisodeResponse:
    """Team episodes, phase two."""
    return await server_of(request).commit(bearer(request), episode_id)


@router.get("/teams/{team_id}", response_model=TeamDecisionResponse)
async def team_decision(request: Request, team_id: str) -> TeamDecisionResponse:
    """The coordinator's decision for a team (authorised by the team secret)."""
    return server_of(request).team_decision(team_id, bearer(request))


@router.get("/status", response_model=ServerStatus)
async def status(request: Request) -> ServerStatus:
    server = server_of(request)
    token = bearer(request)
    swarm_ok = server._token_ok(token, server.config.swarm_token)
    admin_ok = server.config.admin_token is not None and server._token_ok(token, server.config.admin_token)
    if not (swarm_ok or admin_ok):
        raise unauthorized("status needs the swarm token or the admin token")
    return server.status()


@router.get("/episodes/{episode_id}/trace")
async def episode_trace(request: Request, episode_id: str) -> dict:
    """Every sample's tokens, loss mask, behaviour logprobs, agent and call boundaries, plus merge and drift
    statistics. Needs the admin token, or the episode's own key."""
    server = server_of(request)
    return await asyncio.to_thread(server.trace, bearer(request), episode_id)
