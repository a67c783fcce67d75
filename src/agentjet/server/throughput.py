"""The server's request-path throughput counters (calls, generated tokens, ended episodes) and their rates."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentjet.server.clock import Clock, SystemClock


@dataclass
class Throughput:
    clock: Clock = field(default_factory=SystemClock)
    started: float = 0.0
    calls: int = 0
    generated_tokens: int = 0
    ended: int = 0

    def __post_init__(self) -> None:
        self.started = self.started or self.clock.monotonic()

    def as_dict(self) -> dict[str, float]:
        elapsed = max(self.clock.monotonic() - self.started, 1e-9)
        return {"uptime_s": elapsed, "calls": self.calls, "generated_tokens": self.generated_tokens,
                "episodes_ended": self.ended, "calls_per_s": self.calls / elapsed,
                "tokens_per_s": self.generated_tokens / elapsed}
