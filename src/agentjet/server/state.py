"""The server's life, as a state machine."""

from __future__ import annotations

import enum


class ServerState(enum.StrEnum):
    STARTING = "starting"  # loading the engine, resuming from a checkpoint
    READY = "ready"  # accepting episodes
    STOPPING = "stopping"  # checkpointing, closing the engine
    STOPPED = "stopped"
