"""Tinker sessions and their leases on the server's clock (the SDK beats ``session_heartbeat`` every 10 s)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from agentjet.runtime.clock import Clock
from agentjet.server.tinker.errors import TinkerError


@dataclass
class Session:
    session_id: str
    last_seen: float
    tags: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)  # the training clients created in it (freed with it)


class Sessions:
    """The live sessions. A session with no heartbeat for ``lease_seconds`` is past its lease (``expired``); what
    that frees is the service's to do (``TinkerService.expire``)."""

    def __init__(self, clock: Clock, lease_seconds: float) -> None:
        self.clock = clock
        self.lease_seconds = lease_seconds
        self.live: dict[str, Session] = {}

    def create(self, tags: list[str]) -> Session:
        sid = f"session-{uuid.uuid4().hex[:12]}"
        self.live[sid] = s = Session(sid, self.clock.monotonic(), list(tags))
        return s

    def get(self, session_id: str) -> Session:
        s = self.live.get(session_id)
        if s is None:
            raise TinkerError(f"unknown session {session_id!r} (expired, finished or never created)", 404)
        return s

    def heartbeat(self, session_id: str) -> None:
        self.get(session_id).last_seen = self.clock.monotonic()

    def pop(self, session_id: str) -> Session | None:
        return self.live.pop(session_id, None)

    def expired(self) -> list[str]:
        """The sessions past their lease (still listed: ``pop`` them)."""
        now = self.clock.monotonic()
        return [sid for sid, s in self.live.items() if now - s.last_seen > self.lease_seconds]
