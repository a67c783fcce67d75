"""Plain data the dashboard and the metrics read from a running server, and the protocol that provides it.

``agentjet.server.views.observe_source.ServerSource`` implements ``DashboardSource`` on a ``SwarmServer``."""

from __future__ import annotations

import enum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, computed_field

from agentjet.protocol import AdapterStatus, FleetStatus, TinkerStatus


class DropReason(enum.StrEnum):
    """Why an episode's samples never reached a train step."""

    STALE = "stale"  # older than max_staleness policy versions when its batch came
    UNIFORM = "uniform"  # its group's rewards were all equal (no advantage)
    EXPIRED = "expired"  # the lease ran out (the client died or hung)
    ABORTED = "aborted"  # the client aborted it (or rejoined and released it)
    TEAM_ABORTED = "team_aborted"  # prepared, but its team did not commit


class RunSnapshot(BaseModel):
    """A running server at one moment: its one read model. ``GET /swarm/v1/status``, the dashboard's run page and
    the Prometheus metrics all render this (built by ``agentjet.server.views.run_state.snapshot``). Counters are
    cumulative since start unless said otherwise."""

    model: str
    engine: str  # the layout: <generator>+<learner>
    engine_info: dict[str, Any] = Field(default_factory=dict)  # what runs where (``ComposedEngine.describe``)
    engine_state: str  # "paused" while training is paused, else the server's lifecycle state
    paused: bool
    policy_version: int  # the served version: its step committed, its weights held by the generator
    learner_version: int  # the learner's: ahead of policy_version while a push is in flight (or after one failed)
    weight_push_in_flight: bool = False
    train_steps: int
    uptime_s: float
    open_episodes: int
    pending_episodes: int
    trained_episodes: int
    eval_episodes: int
    client_ids: list[str] = Field(default_factory=list, exclude=True)  # every client seen since start
    calls: int
    generated_tokens: int
    episodes_ended: int
    trained_tokens: int
    train_seconds: float = 0.0  # wall seconds in committed train steps, their weight pushes apart
    weight_sync_seconds: float = 0.0  # wall seconds pushing weights to the generator after committed steps
    dropped: dict[DropReason, int]
    tracking: dict[str, int]  # context tracking over the stored episodes: calls, merged_calls, drift_repaired, ...
    tito: dict[str, float] = Field(default_factory=dict)
    admission: dict[str, int] = Field(default_factory=dict)  # capacity, refusals, reserved, waiting, held
    weight_syncs: int | None = None  # None: an engine without a weight-sync seam
    weight_sync_failures: int | None = None
    # the latest step's metrics (a NaN is possible: the status shows it as null; the dashboard reads the steps)
    last_train_metrics: dict[str, float] = Field(default_factory=dict, exclude=True)
    task_types: dict[str, dict[str, float]] = Field(default_factory=dict)  # trained episodes, mean reward
    levels: dict[str, int] = Field(default_factory=dict)  # task type -> the level of its latest training episode
    training_halted: str | None = None
    adapters: dict[str, AdapterStatus] = Field(default_factory=dict)  # per LoRA adapter (a server with several)
    generator: dict[str, int] = Field(default_factory=dict)  # the generator's batching counters (Generator.counters)
    tinker: TinkerStatus | None = None  # the Tinker API's sessions and training clients (None: it is off)
    fleet: FleetStatus | None = None  # the generator replicas and the router's counts (None: one generator)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def clients(self) -> int:
        """Clients seen since start."""
        return len(self.client_ids)


class StepRow(BaseModel):
    step: int
    policy_version: int
    time: float  # unix seconds
    metrics: dict[str, float]


class EvalRow(BaseModel):
    """Mean eval reward at one policy version for one task type, difficulty level (None: the episodes noted
    none) and agent ("*": every agent)."""

    policy_version: int
    task_type: str
    level: int | None = None
    agent: str
    reward_mean: float
    episodes: int


class ClientRow(BaseModel):
    client_id: str
    last_seen: float  # unix seconds
    open_episodes: int
    stored_episodes: int  # ended and acknowledged (train or eval)
    trained_episodes: int
    expired: int  # since this server started
    aborted: int


class EpisodeStatusFilter(enum.StrEnum):
    OPEN = "open"
    PENDING = "pending"
    TRAINED = "trained"
    EVAL = "eval"
    DROPPED = "dropped"  # stale or uniform
    FAILED = "failed"  # expired, aborted or team-aborted
    EXPIRED = "expired"
    ABORTED = "aborted"


class EpisodeFilter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task_type: str | None = Field(None, max_length=256)
    status: EpisodeStatusFilter | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    version: int | None = Field(None, ge=0, description="policy version the episode began at")
    eval: bool | None = None
    client_id: str | None = Field(None, max_length=256)
    limit: int = Field(100, ge=1, le=1000)


class EpisodeRow(BaseModel):
    episode_id: str
    client_id: str
    task_id: str
    task_type: str
    status: str
    eval: bool
    reward: float | dict[str, float] | None  # None: not ended (open, expired, aborted)
    reward_mean: float | None
    begin_policy_version: int
    min_policy_version: int | None
    consumed_step: int | None
    calls: int
    samples: int
    ended_at: float | None
    team_id: str | None = None


class DashboardSource(Protocol):
    """What the dashboard reads from a server. Every method is cheap and may run in a worker thread."""

    def snapshot(self) -> RunSnapshot: ...

    def steps(self, after: int, limit: int, adapter: str | None = None) -> list[StepRow]: ...

    def evals(self) -> list[EvalRow]: ...

    def clients(self) -> list[ClientRow]: ...

    def episodes(self, query: EpisodeFilter) -> list[EpisodeRow]: ...

    def trace(self, episode_id: str) -> dict[str, Any] | None:
        """The token-level trace (``agentjet.tracking.sample_trace`` per sample) with the episode's header,
        the trainer's view per sample (advantage, trainer logprobs) and its team; None when not stored."""
        ...

    def team_episodes(self, team_id: str) -> list[str]: ...

    def tokens(self) -> list[str]:
        """The tokens that may read the dashboard (the read token and the admin token, when set)."""
        ...
