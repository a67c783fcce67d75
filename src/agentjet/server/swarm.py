"""``SwarmServer``: the one object behind the HTTP routes. It builds the parts and runs their lifecycle:

- ``registry`` (open episodes, keys, leases), ``store`` (durable samples), the training core (``training/``: pool, step, loop, checkpoints);
- from ``episodes/``: ``keys`` (``keys.py``: key auth), ``admission`` (``admission.py``: begin, quotas, capacity),
  ``ingest`` (``ingest.py``: calls, token-in/token-out, the durable end), ``episodes`` (``lifecycle.py``: join,
  heartbeat, abort), ``teams`` (``teams.py``: two-phase commit);
- ``counters`` (``counters.py``: every counter, each written by one of the parts above);
- ``auth`` (``auth.py``), the status (``status.py``), and the reaper that expires leases.

The read side (status, dashboard, metrics) gets the parts it reads as one explicit ``RunParts``
(``run_state.py``), never this object, and renders the one ``run_state.snapshot`` of them. The routes find
this object through ``http/deps.py: server_of``.

Building a ``SwarmServer`` touches nothing outside it: it works on its own copy of the config (the data dir
resolved, an admin token generated when none was given) and opens no file. ``start()`` opens the store, the
train log and the metric files, and writes a generated admin token to its owner-only files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from agentjet.engines.base import AdapterSet, Engine
from agentjet.models import agentjet_home
from agentjet.observe.metrics import TRAINLOG_FILE, MetricsHub
from agentjet.observe.trainlog import TrainLog
from agentjet.protocol import ServerStatus
from agentjet.runtime.clock import Clock, SystemClock
from agentjet.server.auth import Auth, new_admin_token, save_admin_token
from agentjet.server.control_plane import ControlPlane
from agentjet.server.counters import RunCounters, TrainingCounters
from agentjet.server.episodes.admission import Admission, LaneView
from agentjet.server.episodes.chat import ChatFormatter
from agentjet.server.episodes.chat_call import Chat
from agentjet.server.episodes.ingest import Ingest, TrainingIntake
from agentjet.server.episodes.keys import EpisodeKeys
from agentjet.server.episodes.lifecycle import Episodes
from agentjet.server.episodes.locks import KeyedLocks
from agentjet.server.episodes.registry import EpisodeRegistry
from agentjet.server.episodes.teams import Teams
from agentjet.server.state import Lifecycle, ServerState
from agentjet.server.store import SampleStore, SQLiteReader, SQLiteStore, StoreReader
from agentjet.server.store_health import StoreHealth
from agentjet.server.tinker import TinkerService
from agentjet.server.training.adapter_lanes import AdapterLanes
from agentjet.server.training.checkpoints import Checkpoints
from agentjet.server.training.lanes import AdapterRouter, Lane, build_lane
from agentjet.server.training.loop import TrainLoop
from agentjet.server.training.pool import GroupPool
from agentjet.server.views.observe_source import ServerSource
from agentjet.server.views.run_state import RunParts, StoredCounts, snapshot
from agentjet.server.views.status import build_status, eval_reward_by_version
from agentjet.settings import ServerConfig

log = logging.getLogger(__name__)


class SwarmServer:
    # opened by start(): they hold files (the routes serve only after start)
    store: SampleStore
    reader: StoreReader
    store_health: StoreHealth
    pool: GroupPool
    checkpoints: Checkpoints
    train_loop: TrainLoop
    teams: Teams
    keys: EpisodeKeys
    admission: Admission
    ingest: Ingest
    chat: Chat
    control: ControlPlane
    episodes: Episodes
    run: RunParts
    observe: ServerSource
    metrics: MetricsHub

    def __init__(self, config: ServerConfig, engine: Engine | AdapterSet, clock: Clock | None = None) -> None:
        """``engine``: one policy (an ``Engine``), or several LoRA adapters on one base (an ``AdapterSet``:
        one training lane per adapter, each agent routed to its adapter)."""
        self._home = agentjet_home()
        self.config = config.model_copy(deep=True)  # the caller's config is left as it is
        self.config.data_dir = config.resolved_data_dir(self._home)
        self._generated_admin_token = self.config.admin_token is None
        if self._generated_admin_token:
            self.config.admin_token = SecretStr(new_admin_token())
        self.admin_token_file: Path | None = None  # where start() wrote a generated admin token
        self.adapters: AdapterSet | None = engine if isinstance(engine, AdapterSet) else None
        # the one policy's engine; with adapters the first adapter's (the tokenizer and the context they share)
        self.engine: Engine = engine.engine(engine.names()[0]) if isinstance(engine, AdapterSet) else engine
        self.router: AdapterRouter | None = None  # with adapters: which lane serves an agent
        self.clock = clock or SystemClock()
        self.auth = Auth.from_config(self.config)
        self.formatter = ChatFormatter(self.engine.tokenizer, self.config.tool_parser)
        self.registry = EpisodeRegistry(self.config.lease_seconds, clock=self.clock)
        self.counters = RunCounters.starting_now(self.clock)  # the read model's counters (``counters.py``)
        self.lifecycle = Lifecycle()
        self.on_stop: Callable[[], None] | None = None  # set by whoever runs the HTTP server
        self._reaper: asyncio.Task[None] | None = None

    @property
    def state(self) -> ServerState:
        return self.lifecycle.state

    @state.setter
    def state(self, state: ServerState) -> None:
        self.lifecycle.state = state

    @property
    def exiting(self) -> Callable[[], bool]:
        """Set by whoever runs the HTTP server: True once it is shutting down (``Lifecycle.exiting``)."""
        return self.lifecycle.exiting

    @exiting.setter
    def exiting(self, exiting: Callable[[], bool]) -> None:
        self.lifecycle.exiting = exiting

    def _open(self) -> None:
        """Open what holds files: the store, the training core over it, the episode lifecycle (key auth, admission,
        ingest, teams), and the read side (the run's parts and snapshot, the dashboard's source and the metrics:
        Prometheus, metrics.jsonl, TensorBoard / W&B)."""
        config, data_dir, counters = self.config, self.data_dir, self.counters
        if self._generated_admin_token:
            token = ServerConfig.secret(config.admin_token)
            assert token is not None
            self.admin_token_file = save_admin_token(token, data_dir, self._home, config.port)
        self.store = SQLiteStore(data_dir / "store.sqlite")  # the backend behind the store's interface
        self.reader = SQLiteReader(self.store.path)
        self.store_health = StoreHealth(self.store)
        self._open_training(data_dir)
        intake = TrainingIntake(self.train_loop, counters.requests)
        locks = KeyedLocks()  # one end / prepare / commit at a time per episode
        self.teams = Teams(self.store, self.registry, locks, self.clock, config.lease_seconds,
                           on_committed=intake.acknowledged)
        self.keys = EpisodeKeys(self.registry, self.store)
        self.admission = Admission(config, self.engine, self.registry, self.pool, self.clock, self.lifecycle,
                                   self.store_health, counters.admission, counters.training,
                                   lanes=self._lane_views)
        self.ingest = Ingest(config, self.engine, self.formatter, self.registry, self.store, self.keys, self.teams,
                             locks, self.clock, self.store_health, intake, self.admission, counters,
                             adapter_of=None if self.router is None else self.router.adapter_of)
        self.chat = Chat(config, self.engine, self.formatter, self.keys, self.registry, self.ingest,
                         engine_for=None if self.router is None else self._engine_for)
        self.episodes = Episodes(config, self.engine, self.registry, self.keys, self.teams, self.admission)
        self.tinker: TinkerService | None = None  # the Tinker training API (/api/v1), with --tinker-key
        tinker_key = ServerConfig.secret(config.tinker_key)
        if tinker_key is not None:
            self.tinker = TinkerService(
                key=tinker_key, served_name=config.name, adapters=self.adapters, clock=self.clock,
                model_path=str(getattr(self.engine.tokenizer, "name_or_path", "") or config.model),
                base_rank=config.learner.lora.rank, max_context=self.engine.max_context, data_dir=data_dir)
        trainlog = TrainLog(data_dir / TRAINLOG_FILE)
        self.run = RunParts(config=config, engine=self.engine, clock=self.clock, registry=self.registry,
                            store=self.store, reader=self.reader,
                            stored=StoredCounts(self.reader, counters, self.lanes, self.teams, self.clock),
                            pool=self.pool, train_loop=self.train_loop, admission=self.admission, teams=self.teams, counters=counters,
                            trainlog=trainlog, lifecycle=self.lifecycle,
                            tinker=None if self.tinker is None else self.tinker.status)
        self.observe = ServerSource(self.run)
        self.metrics = MetricsHub(config.observe, data_dir, self.observe.snapshot, self.public_config(),
                                  trainlog=trainlog)
        self.control = ControlPlane(config, self.engine, self.registry, self.pool, self.train_loop, self.admission,
                                    counters.training, self.clock)
        if self.adapters is not None and self.router is not None:
            self.control.adapters = AdapterLanes(self.adapters, self.router, self.train_loop, self._new_adapter_lane)
        for lane in self.lanes:
            lane.step.observer = self.metrics
        self.train_loop.on_capacity = self.admission.pump

    def _config(self) -> ServerConfig:
        return self.config  # read afresh: the control plane swaps live sections between steps

    def _open_training(self, data_dir: Path) -> None:
        """The training core over the store: one lane (group pool, checkpoints, batch step) per policy, and the
        loop that steps them. The first lane's counters are the run's (``counters.training``)."""
        if self.adapters is None:
            lanes = [build_lane(None, self.engine, self.store, self.counters.training, self._config,
                                data_dir / "checkpoints", self.clock)]
        else:
            names = self.adapters.names()
            lanes = [self._adapter_lane(name, self.counters.training if i == 0 else TrainingCounters())
                     for i, name in enumerate(names)]
            self.router = AdapterRouter({lane.name: lane for lane in lanes if lane.name is not None},
                                        self.config.default_adapter())
        self.pool = lanes[0].pool
        self.checkpoints = lanes[0].checkpoints
        self.train_loop = TrainLoop(lanes, self.store, self.clock)

    def _adapter_lane(self, name: str, counters: TrainingCounters) -> Lane:
        assert self.adapters is not None
        return build_lane(name, self.adapters.engine(name), self.store, counters, self._config,
                          self.data_dir / "checkpoints", self.clock)

    def _new_adapter_lane(self, name: str) -> Lane:
        """A lane for an adapter added at run time (its step reports to the run's metrics)."""
        lane = self._adapter_lane(name, TrainingCounters())
        lane.step.observer = self.metrics
        return lane

    def _lane_views(self, agents: Sequence[str] | None) -> list[LaneView]:
        """What admission reads of the lanes an episode calling ``agents`` may use (None: any)."""
        lanes = self.lanes if agents is None or self.router is None else self.router.lanes_for(agents)
        return [LaneView(lane.engine, lane.pool) for lane in lanes]

    def _engine_for(self, agent: str) -> Engine:
        assert self.router is not None
        return self.router.lane(agent).engine

    @property
    def lanes(self) -> list[Lane]:
        return self.train_loop.lanes

    @property
    def data_dir(self) -> Path:
        assert self.config.data_dir is not None  # resolved in __init__
        return self.config.data_dir

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._open()
        for lane in self.lanes:
            if self.config.resume:
                await asyncio.to_thread(lane.checkpoints.resume)
            lane.engine.set_learning_rate(self.config.learner.learning_rate)  # the configured rate wins on resume
            lane.engine.set_loss(self.config.loss)
        self.teams.load()
        for lane in self.lanes:
            n = lane.pool.load_pending()
            if n:
                log.info("%d acknowledged episodes waiting in the store for %s", n, lane.label)
        self.train_loop.start()
        self._reaper = asyncio.get_running_loop().create_task(self._reap_loop())
        self.state = ServerState.READY

    async def stop(self, checkpoint: bool = True) -> None:
        self.state = ServerState.STOPPING
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await self.train_loop.stop()
        if self.tinker is not None:
            await self.tinker.close()
        for lane in self.lanes if checkpoint else []:
            if lane.counters.train_steps:
                await asyncio.to_thread(lane.checkpoints.save)
        await (self.engine if self.adapters is None else self.adapters).close()
        self.metrics.close()
        self.reader.close()
        self.store.close()
        self.state = ServerState.STOPPED

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.config.lease_seconds / 4))
            try:
                await self.reap()
            except Exception:  # one bad sweep must not end the sweeping: leases would never expire again
                log.exception("the lease sweep failed; it runs again in the next interval")

    async def reap(self) -> None:
        """Expire episodes whose lease ran out; resolve team episodes whose commit never came; drop Tinker sessions
        whose lease ran out."""
        for ep in self.registry.expire_due():
            log.info("episode %s (client %s) expired: lease ran out", ep.episode_id, ep.client_id)
        self.admission.pump()  # expired places are free; held begins past their wait are answered
        if self.teams.prepared:
            await self.teams.resolve_expired()
        if self.tinker is not None:
            self.tinker.expire()  # Tinker sessions past their lease: their training clients' adapters are freed

    # ------------------------------------------------------------------ views
    def status(self) -> ServerStatus:
        return build_status(snapshot(self.run), eval_reward_by_version(self.reader), self.public_config())

    def public_config(self) -> dict[str, Any]:
        return self.config.public_dict()

