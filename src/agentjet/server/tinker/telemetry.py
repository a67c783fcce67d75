"""The SDK's telemetry (``POST telemetry``): its error events kept in the server's log, so a failure on the client
side (an exception in the SDK, a request that failed there) leaves a trace here. Rate-limited on the server's clock:
at most ``limit`` events a ``window_s``; the rest are counted and the count is logged with the next window's first."""

from __future__ import annotations

import logging
from typing import Any

from agentjet.runtime.clock import Clock

log = logging.getLogger(__name__)  # agentjet.server.tinker.telemetry

KEPT = ("ERROR", "CRITICAL")  # severities kept; the SDK's INFO/WARNING events (session start and end...) are not


class ClientErrors:
    def __init__(self, clock: Clock, limit: int = 20, window_s: float = 60.0) -> None:
        self.clock = clock
        self.limit = limit
        self.window_s = window_s
        self._window_start = -float("inf")
        self._in_window = 0
        self.suppressed = 0  # events over the limit since the last one logged
        self.logged = 0

    def record(self, body: dict[str, Any]) -> int:
        """Log the batch's error events (within the rate limit); the number logged."""
        events = body.get("events")
        if not isinstance(events, list):
            return 0
        session = _loggable(str(body.get("session_id", "?"))[:64])
        sdk = _loggable(str(body.get("sdk_version", "?"))[:32])
        n = 0
        for e in events:
            if not isinstance(e, dict) or str(e.get("severity", "")).upper() not in KEPT:
                continue
            if self._admit():
                log.warning("tinker client error (session %s, sdk %s): %s", session, sdk, _describe(e))
                n += 1
        self.logged += n
        return n

    def _admit(self) -> bool:
        now = self.clock.monotonic()
        if now - self._window_start >= self.window_s:
            if self.suppressed:
                log.warning("tinker client errors: %d more were not logged (at most %d a %.0f s)",
                            self.suppressed, self.limit, self.window_s)
            self._window_start, self._in_window, self.suppressed = now, 0, 0
        if self._in_window >= self.limit:
            self.suppressed += 1
            return False
        self._in_window += 1
        return True


def _describe(event: dict[str, Any]) -> str:
    """One line: the event's name or type, its error, and a short payload (bounded: a client controls it)."""
    name = event.get("event_name") or event.get("error_type") or event.get("event", "event")
    parts = [str(name)]
    if event.get("error_message"):
        parts.append(str(event["error_message"]))
    data = event.get("event_data")
    if isinstance(data, dict):
        parts.extend(f"{k}={str(v)[:200]}" for k, v in list(data.items())[:8])
    return _loggable(" ".join(parts)[:2000].replace("\n", " | "))


def _loggable(text: str) -> str:
    """Client text as valid UTF-8 (a lone surrogate as ``\\udfff``): a log handler, a file or a test capture must be
    able to write every line the server logs."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
