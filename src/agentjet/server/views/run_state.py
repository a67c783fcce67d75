"""The server's one read model, read side: the parts of a running server that the views read, named explicitly
(no back-reference to ``SwarmServer``), and the one ``snapshot`` of them that every view renders:
``GET /swarm/v1/status`` (``status.py``), the dashboard's run page (``observe_source.py``) and the Prometheus
metrics and per-step context (``observe/metrics.py``). The counters themselves are written in ``counters.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentjet.engines.base import Engine
from agentjet.observe.schema import DropReason, RunSnapshot
from agentjet.observe.trainlog import TrainLog
from agentjet.protocol import AdapterStatus, TinkerStatus
from agentjet.runtime.clock import Clock
from agentjet.server.counters import RunCounters
from agentjet.server.episodes.admission import Admission
from agentjet.server.episodes.registry import EpisodeRegistry
from agentjet.server.episodes.teams import Teams
from agentjet.server.state import Lifecycle
from agentjet.server.store import SampleStore, StoreReader
from agentjet.server.training.lanes import Lane
from agentjet.server.training.loop import TrainLoop
from agentjet.server.training.pool import GroupPool
from agentjet.settings import ServerConfig


class StoredCounts:
    """Episodes per stored status, counted through the read side's own connection (``StoreReader``). Every
    view shares one count while nothing that moves it has happened, and for at most ``ttl_s``."""

    def __init__(self, reader: StoreReader, counters: RunCounters, lanes: Sequence[Lane], teams: Teams, clock: Clock,
                 ttl_s: float = 2.0) -> None:
        """``lanes``: the training lanes (the train loop's live list: an adapter added at run time counts)."""
        self.reader = reader
        self.counters = counters
        self.lanes = lanes
        self.teams = teams
        self.clock = clock
        self.ttl_s = ttl_s
        self._cached: tuple[float, tuple[int, ...], dict[str, int]] = (-1e18, (), {})

    def _moved(self) -> tuple[int, ...]:
        """What changes whenever a stored status does: an episode acknowledged (ended or committed), one
        prepared or resolved, the train loop taking from the pool (steps, drops, batches with nothing to learn)."""
        lanes = [(lane.counters, lane.pool) for lane in list(self.lanes)]
        return (self.counters.requests.episodes_ended, len(self.teams.prepared),
                *(n for t, pool in lanes for n in (t.train_steps, t.trained_episodes, t.dropped_stale,
                                                   t.dropped_uniform, pool.pending_count, pool.in_step)))

    def by_status(self) -> dict[str, int]:
        key = self._moved()  # read before the count: a change in between makes the next call count again
        at, cached_key, counts = self._cached
        now = self.clock.monotonic()
        if key != cached_key or now - at > self.ttl_s:
            counts = self.reader.count_by_status()  # every stored status, 0 where none
            self._cached = (now, key, counts)
        return counts


@dataclass(frozen=True)
class RunParts:
    config: ServerConfig
    engine: Engine
    clock: Clock
    registry: EpisodeRegistry
    store: SampleStore  # the trace reads samples through it
    reader: StoreReader  # every other read of the store
    stored: StoredCounts
    pool: GroupPool
    train_loop: TrainLoop
    admission: Admission
    teams: Teams
    counters: RunCounters
    trainlog: TrainLog
    lifecycle: Lifecycle
    tinker: Callable[[], TinkerStatus] | None = None  # the Tinker API's clients (``TinkerService.status``), if on

    def engine_state(self) -> str:
        """The run's state as every view shows it: ``paused`` while training is paused, else the server's
        lifecycle state."""
        return "paused" if self.train_loop.paused else self.lifecycle.state.value


@dataclass(frozen=True)
class Versions:
    """The policy versions a client reads (design §6): ``served`` is the one every view names as the policy
    version, committed (its step's episodes are trained) and held by the generator; ``learner`` may be ahead of
    it while the step's weights are pushed (``push_in_flight``) or after a push failed."""

    served: int
    learner: int
    push_in_flight: bool


def lane_versions(lane: Lane) -> Versions:
    engine = lane.engine
    return Versions(served=lane.counters.served_version(engine.generator_version), learner=engine.policy_version,
                    push_in_flight=engine.weight_push_in_flight)


def versions(run: RunParts) -> Versions:
    """The run's versions: its one policy's; with several adapters, the oldest of theirs."""
    each = [lane_versions(lane) for lane in list(run.train_loop.lanes)]
    return Versions(served=min(v.served for v in each), learner=min(v.learner for v in each),
                    push_in_flight=any(v.push_in_flight for v in each))


def adapter_statuses(run: RunParts) -> dict[str, AdapterStatus]:
    """One entry per LoRA adapter (empty on a server with one policy)."""
    out = {}
    for lane in list(run.train_loop.lanes):
        if lane.name is None:
            continue
        v, t = lane_versions(lane), lane.counters
        out[lane.name] = AdapterStatus(
            policy_version=v.served, learner_version=v.learner, weight_push_in_flight=v.push_in_flight,
            train_steps=t.train_steps, trained_episodes=t.trained_episodes, trained_tokens=t.trained_tokens,
            pending_episodes=lane.pool.pending_count, dropped_stale_episodes=t.dropped_stale,
            dropped_uniform_episodes=t.dropped_uniform,
            last_train_metrics={k: v if math.isfinite(v) else None for k, v in t.last_metrics.items()},
            training_halted=t.halted_reason)
    return out


def snapshot(run: RunParts) -> RunSnapshot:
    """The run at one moment, for every view. It may run in a worker thread (dashboard polls, Prometheus
    scrapes): collections that the event loop changes are copied in one call (``list``, ``dict``, ``sorted``)
    before they are iterated. The versions are read before the stored counts: both only grow, so a snapshot
    that names version N counts at least N's trained episodes even when a step commits in between."""
    v = versions(run)
    counts = run.stored.by_status()
    c, t, reg = run.counters, run.counters.training, run.registry
    lanes = list(run.train_loop.lanes)
    sync = run.engine.weight_sync
    return RunSnapshot(
        model=run.config.name, engine=run.engine.layout, engine_info=run.engine.describe(),
        engine_state=run.engine_state(), paused=run.train_loop.paused, policy_version=v.served,
        learner_version=v.learner, weight_push_in_flight=v.push_in_flight,
        train_steps=sum(lane.counters.train_steps for lane in lanes), uptime_s=max(run.clock.monotonic() - c.requests.started, 1e-9),
        open_episodes=reg.open_count, pending_episodes=counts["pending"], trained_episodes=counts["trained"],
        eval_episodes=counts["eval"], client_ids=sorted(reg.clients), calls=c.requests.calls,
        generated_tokens=c.requests.generated_tokens, episodes_ended=c.requests.episodes_ended,
        trained_tokens=sum(lane.counters.trained_tokens for lane in lanes),
        train_seconds=sum(lane.counters.train_seconds for lane in lanes),
        weight_sync_seconds=sum(lane.counters.weight_sync_seconds for lane in lanes),
        dropped={DropReason.STALE: counts["dropped_stale"], DropReason.UNIFORM: counts["dropped_uniform"],
                 DropReason.EXPIRED: reg.counts["expired"], DropReason.ABORTED: reg.counts["aborted"],
                 DropReason.TEAM_ABORTED: counts["aborted"]},
        tracking=c.tracking.as_dict(), tito=c.tito.as_dict(),
        admission={"capacity": run.admission.capacity(), "refusals": c.admission.refusals,
                   "reserved": run.admission.reserved(), "waiting": len(run.admission.queue),
                   "held": c.admission.held},
        weight_syncs=sync.syncs if sync is not None else None,
        weight_sync_failures=sync.failures if sync is not None else None,
        last_train_metrics=dict(t.last_metrics),
        task_types={k: {"episodes": v.episodes, "reward_mean": v.reward_mean} for k, v in list(t.by_type.items())},
        levels=dict(c.levels.latest),
        training_halted=next((lane.counters.halted_reason for lane in lanes if lane.counters.halted_reason), None),
        adapters=adapter_statuses(run), generator=run.engine.generator.counters(),
        tinker=run.tinker() if run.tinker is not None else None, fleet=run.engine.generator.fleet())
