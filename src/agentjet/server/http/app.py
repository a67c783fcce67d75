"""The FastAPI application and ways to run it (blocking, or in a background thread)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable

import uvicorn
from fastapi import FastAPI

from agentjet.layouts import build_engine
from agentjet.layouts.composed import ComposedEngine
from agentjet.server.http import (
    anthropic_api,
    completions_api,
    control,
    dashboard,
    openai_api,
    responses_api,
    swarm_api,
    tinker_api,
)
from agentjet.server.http.errors import BodySizeLimit, install_error_handlers
from agentjet.server.swarm import SwarmServer
from agentjet.server.views.run_state import versions
from agentjet.settings import ServerConfig
from agentjet.version import __version__

log = logging.getLogger(__name__)

# the Tinker SDK sends forward_backward chunks of up to ~5 MB serialized (1024 datums): JSON of those is larger
TINKER_MAX_BODY_BYTES = 64 * 1024 * 1024


def create_app(server: SwarmServer) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await server.start()
        try:
            yield
        finally:
            await server.stop()

    app = FastAPI(title="AgentJet swarm server", version=__version__, lifespan=lifespan)
    app.state.swarm = server
    app.state.auth = server.auth
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=server.config.max_body_bytes,
                       wider={tinker_api.router.prefix + "/": TINKER_MAX_BODY_BYTES})

    @app.get("/health")
    async def health() -> dict[str, str | int]:
        # pid: a launcher checks that the server answering on its port is the process it started, not another
        # that took the port first (free ports are picked before the child binds; parallel test workers race)
        return {"status": server.state.value, "policy_version": versions(server.run).served, "pid": os.getpid()}

    app.include_router(openai_api.router)
    app.include_router(responses_api.router)
    app.include_router(anthropic_api.router)
    app.include_router(completions_api.router)
    app.include_router(swarm_api.router)
    app.include_router(control.router)
    app.include_router(tinker_api.router)
    dashboard.install(app, server, server.config.observe,
                      cookie_name=f"ajet_dash_{server.config.port}")  # /dashboard, its APIs and /metrics
    return app


def serve(config: ServerConfig, engine: ComposedEngine | None = None) -> None:
    """Run the server in the foreground until interrupted (its process: the GIL's switch interval is set here)."""
    if config.generator.gil_switch_interval_ms is not None:
        sys.setswitchinterval(config.generator.gil_switch_interval_ms / 1000)
    server = SwarmServer(config, engine or build_engine(config))
    runner = uvicorn.Server(uvicorn.Config(create_app(server), host=config.host, port=config.port,
                                           log_level="warning"))
    server.on_stop = lambda: setattr(runner, "should_exit", True)
    server.exiting = lambda: bool(runner.should_exit)
    runner.run()


class BackgroundServer:
    """Run a SwarmServer with uvicorn on its own thread and event loop (tests, the demo)."""

    def __init__(self, server: SwarmServer) -> None:
        self.server = server
        self.app = create_app(server)
        cfg = server.config
        self._uvicorn = uvicorn.Server(uvicorn.Config(self.app, host=cfg.host, port=cfg.port, log_level="warning",
                                                      lifespan="on"))
        self._thread = threading.Thread(target=self._uvicorn.run, name="agentjet-server", daemon=True)
        server.on_stop = lambda: setattr(self._uvicorn, "should_exit", True)
        server.exiting = lambda: bool(self._uvicorn.should_exit)

    @property
    def url(self) -> str:
        return f"http://{self.server.config.host}:{self.server.config.port}"

    def start(self, timeout: float = 60.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the swarm server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._uvicorn.should_exit = True
        self._thread.join(timeout=60)

    def call(self, coro: Awaitable[object]) -> object:
        """Run a coroutine on the server's event loop (for tests poking at internals)."""
        loop = self._loop()
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=60)  # type: ignore[arg-type]

    def _loop(self) -> asyncio.AbstractEventLoop:
        return self.server.train_loop.event_loop()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
