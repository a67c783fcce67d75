"""What every route module shares (the HTTP edge; the domain root, ``swarm.py``, imports no web framework):
the ``SwarmServer`` behind a request, and the bearer-token dependencies that check a request against the
``Auth`` kept on the app's state."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from agentjet.server.auth import Auth
from agentjet.server.swarm import SwarmServer

_bearer_scheme = HTTPBearer(auto_error=False, description="the swarm token, the admin token or an episode key")


class EchoJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: an answer that echoes what the client sent (metadata, tools)
    stays valid to send even when that holds a lone surrogate, which UTF-8 cannot encode."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def server_of(request: Request) -> SwarmServer:
    server: SwarmServer = request.app.state.swarm
    return server


def bearer(credentials: HTTPAuthorizationCredentials | None = Depends(_bearer_scheme)) -> str | None:
    """The bearer token of the request, or None."""
    token = credentials.credentials.strip() if credentials is not None else ""
    return token or None


def api_key(request: Request, token: str | None = Depends(bearer)) -> str | None:
    """An episode key as Anthropic's clients send it: the ``x-api-key`` header (the SDK's ``api_key``), or a
    bearer token (``ANTHROPIC_AUTH_TOKEN``, what Claude Code sends)."""
    return (request.headers.get("x-api-key") or "").strip() or token


def _auth(request: Request) -> Auth:
    return request.app.state.auth


def require_swarm(request: Request, token: str | None = Depends(bearer)) -> None:
    _auth(request).check_swarm(token)


def require_admin(request: Request, token: str | None = Depends(bearer)) -> None:
    _auth(request).check_admin(token)


def require_swarm_or_admin(request: Request, token: str | None = Depends(bearer)) -> None:
    _auth(request).check_swarm_or_admin(token)
