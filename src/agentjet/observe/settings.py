"""Settings of the observe room, a small model that the server's settings nest as ``observe``."""

from __future__ import annotations

import enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class LogSink(enum.StrEnum):
    """Optional metric sinks next to the JSONL file (which is always written)."""

    TENSORBOARD = "tensorboard"  # needs the `tracking` extra (tensorboard)
    WANDB = "wandb"  # needs the `tracking` extra (wandb)


class ObserveSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    read_token: str | None = Field(None, description="read-only access to the dashboard and /metrics (the admin "
                                   "token works too); never accepted in a URL")
    log_to: list[LogSink] = Field(default_factory=list, description="extra metric sinks: tensorboard, wandb")
    metrics_open: bool = Field(False, description="serve /metrics without a token (for a Prometheus scraping "
                               "over loopback); by default it needs the read or admin token as a bearer token")
    wandb_project: str = "agentjet"
    bench_history: Path | None = Field(None, description="the `ajet bench` history file the dashboard's Bench "
                                       "page shows")
    session_ttl_s: float = Field(12 * 3600, gt=0, description="how long a dashboard login lasts")
    max_sessions: int = Field(256, ge=1, description="dashboard logins kept at once (the oldest go first)")
