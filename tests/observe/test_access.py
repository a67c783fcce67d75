"""Dashboard sessions and token checks, on a fake clock."""

from __future__ import annotations

from agentjet.observe.access import Sessions, token_matches
from agentjet.runtime.clock import FakeClock


def test_sessions_expire_and_are_bounded() -> None:
    clock = FakeClock()
    s = Sessions(ttl_s=60, max_sessions=2, clock=clock)
    a = s.create()
    assert s.valid(a) and not s.valid("forged") and not s.valid(None)
    clock.advance(59)
    assert s.valid(a)
    clock.advance(2)
    assert not s.valid(a) and len(s) == 0  # expired and forgotten
    b, c, d = s.create(), s.create(), s.create()
    assert not s.valid(b) and s.valid(c) and s.valid(d)  # the oldest login went first
    s.drop(c)
    assert not s.valid(c)


def test_token_matches_only_configured_tokens() -> None:
    assert token_matches("read", ["read", "admin"]) and token_matches("admin", ["read", "admin"])
    assert not token_matches("", ["read"]) and not token_matches(None, ["read"])
    assert not token_matches("anything", [])  # no token configured: nobody gets in
    assert not token_matches("rea", ["read"])
