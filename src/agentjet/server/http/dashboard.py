"""The dashboard: pages (plain HTML/JS/CSS under ``static/``, no build step), the JSON APIs they poll, and
``/metrics`` for Prometheus.

Access: a login (``POST /dashboard/login`` with the read or admin token in the form body) gives an HttpOnly,
SameSite=Strict session cookie; scripts may send ``Authorization: Bearer <read or admin token>`` instead. Pages
without a session redirect to the login form; APIs answer 401 in OpenAI's error shape. ``/metrics`` takes the
bearer token too, unless ``observe.metrics_open`` is set.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any, Protocol
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response

from agentjet import observe
from agentjet.observe.access import Sessions, token_matches
from agentjet.observe.bench_records import load_history
from agentjet.observe.metrics import MetricsHub
from agentjet.observe.schema import DashboardSource, EpisodeFilter
from agentjet.settings import ObserveSettings

STATIC = Path(observe.__file__).parent / "static"  # the dashboard page is observe's front end
PAGES = ("run", "clients", "episodes", "trace", "bench")
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".png": "image/png",
                ".svg": "image/svg+xml"}
# The pages load only their own scripts and styles; uPlot sets element styles from script.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                               "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
MAX_LOGIN_BODY = 4096


class DashboardAuthError(Exception):
    """No valid session cookie or bearer token (answered 401 in OpenAI's error shape)."""


def _error(status: int, message: str, type_: str, code: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": None, "code": code}}, status,
                        headers={"Cache-Control": "no-store"})


class ObservedRun(Protocol):
    """What the dashboard reads. A server opens these when it starts (they hold files); its routes serve only
    after that, so the dashboard asks for them on each request instead of at install time."""

    @property
    def observe(self) -> DashboardSource: ...

    @property
    def metrics(self) -> MetricsHub: ...


class Dashboard:
    def __init__(self, run: ObservedRun, settings: ObserveSettings, cookie_name: str) -> None:
        self.run = run
        self.settings = settings
        self.cookie_name = cookie_name
        self.sessions = Sessions(settings.session_ttl_s, settings.max_sessions)

    @property
    def source(self) -> DashboardSource:
        return self.run.observe

    @property
    def hub(self) -> MetricsHub:
        return self.run.metrics

    # ------------------------------------------------------------------ access
    def _bearer(self, request: Request) -> str | None:
        auth = request.headers.get("authorization", "")
        scheme, _, value = auth.partition(" ")
        return value.strip() if scheme.lower() == "bearer" else None

    def allowed(self, request: Request) -> bool:
        if self.sessions.valid(request.cookies.get(self.cookie_name)):
            return True
        return token_matches(self._bearer(request), self.source.tokens())

    def require(self, request: Request) -> None:
        if not self.allowed(request):
            raise DashboardAuthError()

    def _page(self, name: str) -> FileResponse:
        return FileResponse(STATIC / f"{name}.html", media_type="text/html", headers=SECURITY_HEADERS)

    # ------------------------------------------------------------------ routes
    def router(self) -> APIRouter:
        r = APIRouter()

        @r.get("/metrics", include_in_schema=False)
        async def metrics(request: Request) -> Response:
            if not self.settings.metrics_open and not token_matches(self._bearer(request), self.source.tokens()):
                raise DashboardAuthError()
            body = await asyncio.to_thread(self.hub.prometheus)
            return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

        @r.get("/dashboard", include_in_schema=False)
        async def root() -> RedirectResponse:
            return RedirectResponse("/dashboard/run", 303)

        @r.get("/dashboard/login", include_in_schema=False)
        async def login_page() -> FileResponse:
            return self._page("login")

        @r.post("/dashboard/login", include_in_schema=False)
        async def login(request: Request) -> Response:
            body = await request.body()
            if len(body) > MAX_LOGIN_BODY:
                return _error(413, "login body too large", "invalid_request_error", "body_too_large")
            form = parse_qs(body.decode("utf-8", "replace"))
            token = (form.get("token") or [""])[0].strip()
            target = (form.get("next") or ["/dashboard/run"])[0]
            if not target.startswith("/dashboard/") or target.startswith("//") or "\\" in target:
                target = "/dashboard/run"  # no open redirect
            if not self.source.tokens():
                return RedirectResponse("/dashboard/login?error=no_token", 303)
            if not token_matches(token, self.source.tokens()):
                return RedirectResponse("/dashboard/login?error=wrong", 303)
            resp = RedirectResponse(target, 303)
            resp.set_cookie(self.cookie_name, self.sessions.create(), max_age=int(self.settings.session_ttl_s),
                            path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https")
            return resp

        @r.post("/dashboard/logout", include_in_schema=False)
        async def logout(request: Request) -> RedirectResponse:
            self.sessions.drop(request.cookies.get(self.cookie_name))
            resp = RedirectResponse("/dashboard/login", 303)
            resp.delete_cookie(self.cookie_name, path="/")
            return resp

        @r.get("/dashboard/static/{path:path}", include_in_schema=False)
        async def static(path: str) -> Response:
            target = (STATIC / path).resolve()
            if not target.is_relative_to(STATIC.resolve()) or not target.is_file() or target.suffix == ".html":
                return _error(404, f"no static file {path!r}", "not_found_error", "not_found")
            return FileResponse(target, media_type=STATIC_TYPES.get(target.suffix, "application/octet-stream"),
                                headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})

        @r.get("/dashboard/{page}", include_in_schema=False)
        async def page(request: Request, page: str) -> Response:
            if page not in PAGES:
                return _error(404, f"no dashboard page {page!r}; pages: {', '.join(PAGES)}", "not_found_error",
                              "not_found")
            if not self.allowed(request):
                target = f"/dashboard/{page}" + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"/dashboard/login?{urlencode({'next': target})}", 303)
            return self._page(page)

        # ---------------------------------------------------------------- JSON APIs (polled by the pages)
        @r.get("/dashboard/api/run")
        async def run(request: Request, after: Annotated[int, Query(ge=-1)] = -1,
                      limit: Annotated[int, Query(ge=1, le=5000)] = 2000,
                      evals: bool = True, adapter: Annotated[str | None, Query(max_length=64)] = None) -> Any:
            """The snapshot, the train steps after ``after`` (one LoRA adapter's on a server with several:
            ``adapter``, by default the first) and (unless ``evals=false``) the eval curves."""
            self.require(request)

            def read() -> dict[str, Any] | None:
                snap = self.source.snapshot()
                if adapter is not None and adapter not in snap.adapters:
                    return None
                out: dict[str, Any] = {"snapshot": snap.model_dump(mode="json"),
                                       "steps": [s.model_dump() for s in self.source.steps(after, limit, adapter)]}
                if evals:
                    out["evals"] = [e.model_dump() for e in self.source.evals()]
                return out

            out = await asyncio.to_thread(read)
            if out is None:
                return _error(404, f"this server hosts no adapter {adapter!r}", "not_found_error", "not_found")
            return out

        @r.get("/dashboard/api/clients")
        async def clients(request: Request) -> dict[str, Any]:
            self.require(request)
            rows = await asyncio.to_thread(self.source.clients)
            return {"clients": [c.model_dump() for c in rows]}

        @r.get("/dashboard/api/episodes")
        async def episodes(request: Request, query: Annotated[EpisodeFilter, Query()]) -> dict[str, Any]:
            self.require(request)
            rows = await asyncio.to_thread(self.source.episodes, query)
            return {"episodes": [e.model_dump(mode="json") for e in rows]}

        @r.get("/dashboard/api/episodes/{episode_id}/trace")
        async def trace(request: Request, episode_id: str) -> Response:
            self.require(request)
            data = await asyncio.to_thread(self.source.trace, episode_id)
            if data is None:
                return _error(404, f"episode {episode_id} has no stored samples (unknown, still open, aborted or "
                              "expired)", "not_found_error", "not_found")
            return JSONResponse(data, headers={"Cache-Control": "no-store"})

        @r.get("/dashboard/api/teams/{team_id}")
        async def team(request: Request, team_id: str) -> dict[str, Any]:
            self.require(request)
            return {"team_id": team_id, "episodes": await asyncio.to_thread(self.source.team_episodes, team_id)}

        @r.get("/dashboard/api/bench")
        async def bench(request: Request) -> dict[str, Any]:
            self.require(request)
            path = self.settings.bench_history
            if path is None:
                return {"history": None, "records": [], "message": "no bench history configured "
                        "(ajet server --bench-history FILE)"}
            records = await asyncio.to_thread(load_history, path)
            return {"history": str(path), "records": [json.loads(r.model_dump_json()) for r in records]}

        return r


def install(app: FastAPI, run: ObservedRun, settings: ObserveSettings, cookie_name: str) -> Dashboard:
    """Mount the dashboard, its APIs and /metrics on ``app``."""
    dash = Dashboard(run, settings, cookie_name)

    @app.exception_handler(DashboardAuthError)
    async def _denied(_: Request, __: DashboardAuthError) -> JSONResponse:
        resp = _error(401, "the dashboard APIs and /metrics need the read token or the admin token (log in at "
                      "/dashboard/login, or send Authorization: Bearer <token>)", "authentication_error",
                      "invalid_api_key")
        resp.headers["WWW-Authenticate"] = "Bearer"
        return resp

    app.include_router(dash.router())
    return dash
