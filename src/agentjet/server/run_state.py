"""The parts of a running server that its read side needs, named explicitly (no back-reference to
``SwarmServer``), and the rules both status views share: ``GET /swarm/v1/status`` (``status.py``) and the
dashboard and metrics (``observe_source.py``) read the run through these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentjet.engines.base import Engine
from agentjet.observe.events import TrackingTotals
from agentjet.observe.trainlog import TrainLog
from agentjet.server.clock import Clock
from agentjet.server.episodes import Episodes
from agentjet.server.registry import EpisodeRegistry
from agentjet.server.state import ServerState
from agentjet.server.store import SampleStore
from agentjet.server.teams import Teams
from agentjet.server.throughput import Throughput
from agentjet.server.tito import TitoCounters
from agentjet.server.trainer import Trainer
from agentjet.settings import ServerConfig


@dataclass(frozen=True)
class RunParts:
    config: ServerConfig
    engine: Engine
    clock: Clock
    registry: EpisodeRegistry
    store: SampleStore
    trainer: Trainer
    episodes: Episodes
    teams: Teams
    throughput: Throughput
    tito: TitoCounters
    tracking_totals: TrackingTotals
    trainlog: TrainLog
    lifecycle: Callable[[], ServerState]

    def engine_state(self) -> str:
        """The run's state as both status views show it: ``paused`` while training is paused, else the server's
        lifecycle state."""
        return "paused" if self.trainer.paused else self.lifecycle().value
