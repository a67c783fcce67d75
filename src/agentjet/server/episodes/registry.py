"""The episode registry: open episodes, their keys and their leases.

An episode key is a bearer secret (256 random bits) valid for that episode only. It authorises the
episode's chat calls while the episode is open, and its heartbeat / end / abort. A lease expires when
neither calls nor heartbeats arrive for ``lease_seconds``; a call in flight keeps the lease alive.
"""

from __future__ import annotations

import secrets
import uuid
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Any

from agentjet.protocol import BeginEpisodeRequest, EndEpisodeResponse, EpisodeStatus
from agentjet.runtime.clock import Clock, SystemClock
from agentjet.server.digest import digest
from agentjet.server.episodes.stored import StoredCall
from agentjet.tracking import CallRecord
from agentjet.tracking.drift import TitoSession

KEY_PREFIX = "aj-ep-"


@dataclass
class Episode:
    episode_id: str
    key_hash: str
    client_id: str
    task_id: str
    task_type: str
    group_key: str
    is_eval: bool
    metadata: dict[str, Any]
    begin_policy_version: int
    lease_deadline: float
    status: EpisodeStatus = EpisodeStatus.OPEN
    calls: list[CallRecord] = field(default_factory=list)
    tito: TitoSession | None = None  # token-in/token-out state between the calls (``Ingest.tito_prompt_ids``)
    stored: dict[str, StoredCall] = field(default_factory=dict)  # stored responses by id (``episodes/stored.py``)
    inflight: int = 0
    created_at: float = 0.0
    end_response: EndEpisodeResponse | None = None

    @property
    def is_open(self) -> bool:
        return self.status is EpisodeStatus.OPEN


class EpisodeRegistry:
    def __init__(self, lease_seconds: float, closed_memory: int = 2_000, clock: Clock | None = None) -> None:
        # Closed episodes are remembered for quick idempotent retries; older ones are answered from the store.
        self.lease_seconds = lease_seconds
        self.clock = clock or SystemClock()
        self._open: dict[str, Episode] = {}
        self._by_key: dict[str, str] = {}  # key hash -> episode id (open and recently closed)
        self._closed: OrderedDict[str, Episode] = OrderedDict()  # for idempotent end/abort retries
        self._closed_memory = closed_memory
        self.clients: dict[str, float] = {}  # client id -> last seen (unix time)
        self._open_by_client: Counter[str] = Counter()
        self.open_by_type: Counter[str] = Counter()
        self.open_training = 0  # open episodes that are not eval episodes (admission counts them)
        self.open_by_group: Counter[str] = Counter()  # open training episodes per GRPO group key
        self.counts = {"begun": 0, "expired": 0, "aborted": 0, "released": 0}
        self.closed_by_client: defaultdict[str, Counter[str]] = defaultdict(Counter)  # client -> final status -> n

    # -------------------------------------------------------------- lifecycle
    def begin(self, req: BeginEpisodeRequest, policy_version: int) -> tuple[Episode, str]:
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        ep = Episode(
            episode_id="ep-" + uuid.uuid4().hex,
            key_hash=digest(key),
            client_id=req.client_id,
            task_id=req.task_id,
            task_type=req.task_type,
            group_key=req.group_id or req.task_id,
            is_eval=req.eval,
            metadata=dict(req.metadata),
            begin_policy_version=policy_version,
            lease_deadline=self.clock.monotonic() + self.lease_seconds,
            created_at=self.clock.time(),
        )
        self._open[ep.episode_id] = ep
        self._open_by_client[ep.client_id] += 1
        self.open_by_type[ep.task_type] += 1
        self.open_training += not ep.is_eval
        if not ep.is_eval:
            self.open_by_group[ep.group_key] += 1
        self._by_key[ep.key_hash] = ep.episode_id
        self.clients[req.client_id] = self.clock.time()
        self.counts["begun"] += 1
        return ep, key

    def by_key(self, key: str) -> Episode | None:
        eid = self._by_key.get(digest(key))
        if eid is None:
            return None
        return self._open.get(eid) or self._closed.get(eid)

    def get(self, episode_id: str) -> Episode | None:
        return self._open.get(episode_id) or self._closed.get(episode_id)

    def touch(self, ep: Episode) -> None:
        ep.lease_deadline = self.clock.monotonic() + self.lease_seconds
        self.clients[ep.client_id] = self.clock.time()

    def lease_remaining(self, ep: Episode) -> float:
        return max(0.0, ep.lease_deadline - self.clock.monotonic()) if ep.is_open else 0.0

    def close(self, ep: Episode, status: EpisodeStatus) -> None:
        """Move an open episode to a final status; its calls are dropped from memory."""
        if not ep.is_open:
            return
        ep.status = status
        ep.metadata = {}  # client-sized (up to the body limit) and unused once closed: not kept for 100k episodes
        ep.tito = None  # holds a prompt-sized segmentation per agent: not kept for closed episodes either
        ep.stored = {}  # stored responses live for the episode's life
        self._open.pop(ep.episode_id, None)
        self._open_by_client[ep.client_id] -= 1
        self.open_by_type[ep.task_type] -= 1
        self.open_training -= not ep.is_eval
        if not ep.is_eval:
            self.open_by_group[ep.group_key] -= 1
            if self.open_by_group[ep.group_key] <= 0:
                del self.open_by_group[ep.group_key]
        if self._open_by_client[ep.client_id] <= 0:
            del self._open_by_client[ep.client_id]
        self._closed[ep.episode_id] = ep
        self.closed_by_client[ep.client_id][status.value] += 1
        if status is EpisodeStatus.ABORTED:
            self.counts["aborted"] += 1
        elif status is EpisodeStatus.EXPIRED:
            self.counts["expired"] += 1
        while len(self._closed) > self._closed_memory:
            old_id, old = self._closed.popitem(last=False)
            self._by_key.pop(old.key_hash, None)

    def expire_due(self) -> list[Episode]:
        """Close every open episode whose lease ran out (none with a call in flight)."""
        now = self.clock.monotonic()
        due = [ep for ep in self._open.values() if ep.inflight == 0 and ep.lease_deadline < now]
        for ep in due:
            ep.calls.clear()
            self.close(ep, EpisodeStatus.EXPIRED)
        return due

    def release_client(self, client_id: str) -> int:
        """A client (re)joined: abort the open episodes an earlier process with that id left behind."""
        mine = [ep for ep in self._open.values() if ep.client_id == client_id]
        for ep in mine:
            ep.calls.clear()
            self.close(ep, EpisodeStatus.ABORTED)
        self.counts["released"] += len(mine)
        self.clients[client_id] = self.clock.time()
        return len(mine)

    def episodes(self) -> list[Episode]:
        """The open episodes and the recently closed ones still remembered (newest last)."""
        return [*self._closed.values(), *self._open.values()]

    @property
    def open_count(self) -> int:
        return len(self._open)

    def open_for_client(self, client_id: str) -> int:
        return self._open_by_client[client_id]
