"""``SwarmServer``: the one object behind the HTTP routes. It builds the parts and runs their lifecycle:

- ``registry`` (open episodes, keys, leases), ``store`` (durable samples), ``trainer`` (batching, steps);
- ``episodes`` (``episodes.py``: the episode lifecycle), ``teams`` (``teams.py``: two-phase commit);
- ``auth`` (``auth.py``), the status (``status.py``), and the reaper that expires leases.

The read side (status, dashboard, metrics) gets the parts it reads as one explicit ``RunParts``
(``run_state.py``), never this object. The routes find it through ``routes.server_of``.

Building a ``SwarmServer`` touches nothing outside it: it works on its own copy of the config (the data dir
resolved, an admin token generated when none was given) and opens no file. ``start()`` opens the store, the
train log and the metric files, and writes a generated admin token to its owner-only files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from agentjet.engines.base import Engine
from agentjet.models import agentjet_home
from agentjet.observe.events import TrackingTotals
from agentjet.observe.metrics import TRAINLOG_FILE, MetricsHub
from agentjet.observe.trainlog import TrainLog
from agentjet.protocol import ChangeRecord, ServerStatus
from agentjet.server.auth import Auth, new_admin_token, save_admin_token
from agentjet.server.chat import ChatFormatter
from agentjet.server.clock import Clock, SystemClock
from agentjet.server.episodes import Episodes
from agentjet.server.keys import EpisodeKeys
from agentjet.server.locks import KeyedLocks
from agentjet.server.observe_source import ServerSource
from agentjet.server.registry import EpisodeRegistry
from agentjet.server.run_state import RunParts
from agentjet.server.state import ServerState
from agentjet.server.status import build_status
from agentjet.server.store import SampleStore
from agentjet.server.teams import Teams
from agentjet.server.throughput import Throughput
from agentjet.server.tito import TitoCounters
from agentjet.server.trainer import Trainer
from agentjet.settings import ServerConfig

log = logging.getLogger(__name__)


class SwarmServer:
    # opened by start(): they hold files (the routes serve only after start)
    store: SampleStore
    trainer: Trainer
    teams: Teams
    episodes: Episodes
    keys: EpisodeKeys
    run: RunParts
    observe: ServerSource
    metrics: MetricsHub

    def __init__(self, config: ServerConfig, engine: Engine, clock: Clock | None = None) -> None:
        self._home = agentjet_home()
        self.config = config.model_copy(deep=True)  # the caller's config is left as it is
        self.config.data_dir = config.resolved_data_dir(self._home)
        self._generated_admin_token = self.config.admin_token is None
        if self._generated_admin_token:
            self.config.admin_token = SecretStr(new_admin_token())
        self.admin_token_file: Path | None = None  # where start() wrote a generated admin token
        self.engine = engine
        self.clock = clock or SystemClock()
        self.auth = Auth.from_config(self.config)
        self.formatter = ChatFormatter(engine.tokenizer, self.config.tool_parser)
        self.registry = EpisodeRegistry(self.config.lease_seconds, clock=self.clock)
        self.throughput = Throughput(clock=self.clock)
        self.tito = TitoCounters()
        self.tracking_totals = TrackingTotals()  # merge ratio and drift repairs over every stored episode
        self.state = ServerState.STARTING
        self.change_log: list[ChangeRecord] = []  # live config changes, with the version they took effect at
        self.on_stop: Callable[[], None] | None = None  # set by whoever runs the HTTP server
        # set by whoever runs the HTTP server: True once it is shutting down (it then waits for the requests in
        # flight, so held begins are answered at once instead of at the end of their wait)
        self.exiting: Callable[[], bool] = lambda: False
        self._reaper: asyncio.Task[None] | None = None

    def _open(self) -> None:
        """Open what holds files: the store, the trainer over it, the episode lifecycle, and the read side
        (the dashboard's source and the metrics: Prometheus, metrics.jsonl, TensorBoard / W&B)."""
        config, data_dir = self.config, self.data_dir
        if self._generated_admin_token:
            token = ServerConfig.secret(config.admin_token)
            assert token is not None
            self.admin_token_file = save_admin_token(token, data_dir, self._home, config.port)
        self.store = SampleStore(data_dir / "store.sqlite")
        self.trainer = Trainer(self.engine, self.store, config, data_dir / "checkpoints", clock=self.clock)
        locks = KeyedLocks()
        self.teams = Teams(self.store, self.registry, locks, self.clock, lambda: self.config.lease_seconds,
                           on_committed=lambda stored: self.episodes.acknowledged(stored))
        self.episodes = Episodes(config, self.engine, self.formatter, self.registry, self.store, self.trainer,
                                 self.teams, self.throughput, self.tito, locks, self.clock, self.effective_state,
                                 self.tracking_totals)
        self.keys = self.episodes.keys
        trainlog = TrainLog(data_dir / TRAINLOG_FILE)
        self.run = RunParts(config=config, engine=self.engine, clock=self.clock, registry=self.registry,
                            store=self.store, trainer=self.trainer, episodes=self.episodes, teams=self.teams,
                            throughput=self.throughput, tito=self.tito, tracking_totals=self.tracking_totals,
                            trainlog=trainlog, lifecycle=lambda: self.state)
        self.observe = ServerSource(self.run)
        self.metrics = MetricsHub(config.observe, data_dir, self.observe.snapshot, self.public_config(),
                                  trainlog=trainlog)
        self.trainer.observer = self.metrics
        self.trainer.on_capacity = self.episodes.pump_admission

    @property
    def data_dir(self) -> Path:
        assert self.config.data_dir is not None  # resolved in __init__
        return self.config.data_dir

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._open()
        if self.config.resume:
            await asyncio.to_thread(self.trainer.resume_from_checkpoint)
        self.engine.set_learning_rate(self.config.training.learning_rate)  # the configured rate wins on resume
        self.engine.set_loss(self.config.loss)
        self.teams.load()
        n = self.trainer.load_pending()
        if n:
            log.info("%d acknowledged episodes waiting in the store", n)
        self.trainer.start()
        self._reaper = asyncio.get_running_loop().create_task(self._reap_loop())
        self.state = ServerState.READY

    async def stop(self, checkpoint: bool = True) -> None:
        self.state = ServerState.STOPPING
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await self.trainer.stop()
        if checkpoint and self.trainer.counters.train_steps:
            await asyncio.to_thread(self.trainer.save_checkpoint)
        await self.engine.close()
        self.metrics.close()
        self.observe.close()
        self.store.close()
        self.state = ServerState.STOPPED

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.config.lease_seconds / 4))
            await self.reap()

    async def reap(self) -> None:
        """Expire episodes whose lease ran out; resolve team episodes whose commit never came."""
        for ep in self.registry.expire_due():
            log.info("episode %s (client %s) expired: lease ran out", ep.episode_id, ep.client_id)
        self.episodes.pump_admission()  # expired places are free; held begins past their wait are answered
        if self.teams.prepared:
            await self.teams.resolve_expired()

    # ------------------------------------------------------------------ views
    def effective_state(self) -> ServerState:
        """The state requests see: STOPPING as soon as the HTTP server is shutting down."""
        return ServerState.STOPPING if self.state is ServerState.READY and self.exiting() else self.state

    def status(self) -> ServerStatus:
        return build_status(self.run)

    def public_config(self) -> dict[str, Any]:
        return self.config.public_dict()

