"""The server's life, as a state machine."""

from __future__ import annotations

import enum
from collections.abc import Callable


class ServerState(enum.StrEnum):
    STARTING = "starting"  # loading the engine, resuming from a checkpoint
    READY = "ready"  # accepting episodes
    STOPPING = "stopping"  # checkpointing, closing the engine
    STOPPED = "stopped"


class Lifecycle:
    """Where the server is in its life, and whether the HTTP server that runs it is shutting down (``exiting``:
    set by whoever runs it; it then waits for the requests in flight, so held begins are answered at once)."""

    def __init__(self) -> None:
        self.state = ServerState.STARTING
        self.exiting: Callable[[], bool] = _not_exiting

    def effective(self) -> ServerState:
        """The state requests see: STOPPING as soon as the HTTP server is shutting down."""
        return ServerState.STOPPING if self.state is ServerState.READY and self.exiting() else self.state


def _not_exiting() -> bool:
    return False
