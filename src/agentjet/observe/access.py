"""Who may read the dashboard: the read token or the admin token, given once to a login form (or as a bearer
token by scripts). A login gets a random session id in an HttpOnly, SameSite=Strict cookie; the token itself
never appears in a URL, a cookie or a log."""

from __future__ import annotations

import hmac
import secrets
from collections import OrderedDict
from collections.abc import Sequence

from agentjet.runtime.clock import Clock, SystemClock


def token_matches(given: str | None, allowed: Sequence[str]) -> bool:
    """Constant-time check against every allowed token (no token configured: nobody gets in)."""
    if not given:
        return False
    ok = False
    for token in allowed:
        ok |= hmac.compare_digest(given.encode(), token.encode())
    return ok


class Sessions:
    """Dashboard logins of one server: session id -> expiry. Bounded: the oldest login goes first."""

    def __init__(self, ttl_s: float, max_sessions: int, clock: Clock | None = None) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._clock = clock or SystemClock()
        self._expiry: OrderedDict[str, float] = OrderedDict()

    def create(self) -> str:
        sid = secrets.token_urlsafe(32)
        self._expiry[sid] = self._clock.monotonic() + self.ttl_s
        while len(self._expiry) > self.max_sessions:
            self._expiry.popitem(last=False)
        return sid

    def valid(self, sid: str | None) -> bool:
        if not sid:
            return False
        expiry = self._expiry.get(sid)
        if expiry is None:
            return False
        if expiry < self._clock.monotonic():
            del self._expiry[sid]
            return False
        return True

    def drop(self, sid: str | None) -> None:
        if sid:
            self._expiry.pop(sid, None)

    def __len__(self) -> int:
        return len(self._expiry)
