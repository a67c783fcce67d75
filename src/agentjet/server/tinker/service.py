"""The Tinker API's domain, composed (see ``docs/tinker.md``): one object per concern, and what spans them (the key,
a session's end freeing its clients, the lease sweep, the status the run's snapshot reads).

- ``sessions.Sessions``: sessions and their leases on the server's clock;
- ``futures.Futures``: the futures the SDK polls, each training client's ``seq_id`` order (``SeqOrder``);
- ``models.TinkerModels``: the training clients (one LoRA adapter each), ``forward_backward``, ``optim_step``;
- ``checkpoints.TinkerCheckpoints``: ``tinker://`` states saved, loaded, and new clients made from them;
- ``exports.ExternalWeights``: ``save_weights_external`` (PEFT adapter files), their signed download URLs, TTLs;
- ``runs.TrainingRuns``: each client's training run (``user_metadata``, latest checkpoints), on disk;
- ``samplers.Samplers``: sampling clients (frozen snapshots, or the base) and ``sample``;
- ``telemetry.ClientErrors``: the SDK's error events in the server's log, rate-limited."""

from __future__ import annotations

import hmac
import itertools
import logging
from pathlib import Path
from typing import Any

from agentjet.engines.base import AdapterSet
from agentjet.protocol import TinkerStatus
from agentjet.runtime.clock import Clock
from agentjet.server.tinker.checkpoints import TinkerCheckpoints
from agentjet.server.tinker.exports import ExternalWeights
from agentjet.server.tinker.futures import Futures, SeqOrder
from agentjet.server.tinker.models import TinkerModels
from agentjet.server.tinker.runs import TrainingRuns
from agentjet.server.tinker.samplers import Samplers
from agentjet.server.tinker.sessions import Session, Sessions
from agentjet.server.tinker.telemetry import ClientErrors

log = logging.getLogger(__name__)


class TinkerService:
    def __init__(self, *, key: str, served_name: str, model_path: str, adapters: AdapterSet | None,
                 base_rank: int, max_context: int | None, clock: Clock, data_dir: Path,
                 lease_seconds: float = 120.0) -> None:
        self._key = key.encode()
        self.served_name = served_name
        self.model_path = model_path
        self.adapters = adapters
        self.base_rank = base_rank
        self.max_context = max_context
        self.clock = clock
        self.sessions = Sessions(clock, lease_seconds)
        self.futures = Futures(clock, order_of=self._order_of)
        root = data_dir / "tinker"  # tinker://<adapter>/... lives in <adapter>/
        self.runs = TrainingRuns(root, clock)
        self.models = TinkerModels(adapters, self.sessions, self.runs, served_name=served_name,
                                   model_path=model_path, ids=itertools.count(1))
        self.checkpoints = TinkerCheckpoints(self.models, root)
        self.exports = ExternalWeights(self.models, root, self._key, clock)
        self.samplers = Samplers(self.models)
        self.client_errors = ClientErrors(clock)

    def _order_of(self, model_id: str) -> SeqOrder | None:
        model = self.models.live.get(model_id)
        return None if model is None else model.order

    def key_ok(self, key: str | None) -> bool:
        return key is not None and hmac.compare_digest(key.encode(), self._key)

    def create_session(self, tags: list[str]) -> Session:
        self.expire()
        return self.sessions.create(tags)

    def heartbeat(self, session_id: str) -> None:
        self.expire()
        self.sessions.heartbeat(session_id)

    async def finish(self, session_id: str) -> None:
        """The session's end: its training clients' adapters and their unnamed snapshots freed."""
        s = self.sessions.pop(session_id)
        if s is not None:
            for mid in s.models:
                await self.samplers.drop_snapshots_of(mid)
                await self.models.drop(mid)

    def expire(self) -> list[str]:
        """Sessions past their lease (no heartbeat for ``lease_seconds`` on the server's clock): dropped, their
        models' adapters freed (in the background); finished futures past their keep time dropped."""
        gone = self.sessions.expired()
        for sid in gone:
            self.futures.spawn(self.finish(sid))
            log.info("tinker session %s expired", sid)
        self.futures.expire()
        return gone

    def training_run(self, run_or_model_id: str) -> dict[str, Any]:
        """The SDK's ``TrainingRun`` for a run id (the first segment of its tinker:// paths) or a client's model id."""
        return self.runs.get(self.models.run_id(run_or_model_id)).view()

    def status(self) -> TinkerStatus:
        """Sessions and training clients, for the run's snapshot (the status, the dashboard, Prometheus). It may
        run in a worker thread: the dicts the event loop changes are copied in one call before they are read."""
        models = list(self.models.live.values())
        return TinkerStatus(sessions=len(self.sessions.live), sampling_clients=len(self.samplers.live),
                            training_clients={m.model_id: m.status() for m in models})

    async def close(self) -> None:
        await self.futures.close()
