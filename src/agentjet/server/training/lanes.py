"""Training lanes: one policy's training core each. A server with one policy has one lane over the whole store; a
server with several LoRA adapters on one base (``learner.lora.adapters``) has one lane per adapter, each with its
own engine view (its version, its optimizer, its weight push), its own view of the store (``SampleStore.lane``: what it
has yet to consume, its samples, its steps), its own group pool, step, checkpoints and counters. One train loop
(``loop.py``) steps every lane whose batch is ready; the engine's one worker thread runs the steps in turn.

The agent (role) of a call picks its lane: an agent named like an adapter uses it; another agent uses the default
adapter when one is configured, else it is refused with a 4xx naming the adapters (``AdapterRouter``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentjet.engines.base import Engine
from agentjet.runtime.clock import Clock
from agentjet.server.counters import TrainingCounters
from agentjet.server.errors import APIError
from agentjet.server.store import SampleStore, StoredEpisode, TrainingStore
from agentjet.server.training.checkpoints import Checkpoints
from agentjet.server.training.pool import GroupPool
from agentjet.server.training.step import BatchStep
from agentjet.settings import ServerConfig

log = logging.getLogger(__name__)


@dataclass
class Lane:
    """One policy's training core. ``name`` is its adapter (None on a server with one policy)."""

    name: str | None
    engine: Engine
    store: TrainingStore
    counters: TrainingCounters
    pool: GroupPool
    step: BatchStep
    checkpoints: Checkpoints

    @property
    def label(self) -> str:
        return self.name or "policy"


def build_lane(name: str | None, engine: Engine, store: SampleStore, counters: TrainingCounters,
               config: Callable[[], ServerConfig], checkpoint_root: Path, clock: Clock) -> Lane:
    """A lane over ``store`` (scoped to the adapter when ``name`` is one), checkpointed under ``checkpoint_root``
    (a directory of its own per adapter)."""
    view: TrainingStore = store if name is None else store.lane(name)
    root = checkpoint_root if name is None else checkpoint_root / "adapters" / name
    pool = GroupPool(lambda: config().training, view, counters, clock)
    checkpoints = Checkpoints(root, engine, view, counters, config, clock)
    step = BatchStep(engine, view, counters, config, checkpoints, clock, adapter=name)
    return Lane(name, engine, view, counters, pool, step, checkpoints)


def unknown_agent(agent: str, adapters: Sequence[str]) -> APIError:
    return APIError(404, f"agent {agent!r} names no adapter of this server; its adapters are "
                    f"{', '.join(adapters)} (name one with the X-Agent-Name header or the model field, or start the "
                    "server with --default-adapter)", "invalid_request_error", param="model",
                    code="model_not_found")


@dataclass
class AdapterRouter:
    """Which lane serves an agent: the adapter of its name, else the default adapter, else a 4xx."""

    lanes: dict[str, Lane]
    default: str | None = None

    def _find(self, agent: str) -> Lane | None:
        return self.lanes.get(agent) or (self.lanes.get(self.default) if self.default else None)

    def lane(self, agent: str) -> Lane:
        found = self._find(agent)
        if found is None:
            raise unknown_agent(agent, sorted(self.lanes))
        return found

    def lanes_for(self, agents: Sequence[str]) -> list[Lane]:
        """The lanes that serve ``agents`` (each once; a 4xx for an agent that no adapter serves)."""
        out: list[Lane] = []
        for agent in agents:
            lane = self.lane(agent)
            if all(lane is not seen for seen in out):
                out.append(lane)
        return out or list(self.lanes.values())

    def adapter_of(self, agents: Sequence[str]) -> dict[str, str]:
        """agent -> adapter, for the agents that still route (an adapter removed since its calls is left out)."""
        out = {}
        for agent in agents:
            lane = self._find(agent)
            if lane is not None and lane.name is not None:
                out[agent] = lane.name
        return out


def lanes_of(episode: StoredEpisode, lanes: Sequence[Lane], store: SampleStore) -> list[Lane]:
    """The lanes that must consume an acknowledged episode: the one lane of a single-policy server, else each
    adapter whose calls it holds."""
    if len(lanes) == 1 and lanes[0].name is None:
        return list(lanes)
    used = set(store.episode_adapters(episode.episode_id))
    return [lane for lane in lanes if lane.name in used]
