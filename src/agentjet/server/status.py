"""What ``GET /swarm/v1/status`` reports: the engine and where it runs, the policy version, buffer counts,
clients, throughput, eval reward per policy version, the last train metrics, per-task-type figures and the
public settings."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentjet.protocol import BufferCounts, ServerStatus, reward_mean
from agentjet.server.clock import Clock, SystemClock

if TYPE_CHECKING:
    from agentjet.server.swarm import SwarmServer


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


def eval_reward_by_version(server: SwarmServer) -> dict[str, float]:
    sums: dict[int, list[float]] = defaultdict(list)
    for version, reward in server.store.eval_rewards():
        sums[version].append(reward_mean(reward))
    return {str(v): sum(rs) / len(rs) for v, rs in sorted(sums.items())}


def build_status(server: SwarmServer) -> ServerStatus:
    counts = server.store.count_by_status()
    c = server.trainer.counters
    buffer = BufferCounts(
        open_episodes=server.registry.open_count, pending_episodes=counts["pending"],
        trained_episodes=counts["trained"], dropped_stale_episodes=counts["dropped_stale"],
        dropped_uniform_episodes=counts["dropped_uniform"], expired_episodes=server.registry.counts["expired"],
        aborted_episodes=server.registry.counts["aborted"], eval_episodes=counts["eval"])
    state = "paused" if server.trainer.paused else server.state.value
    engine: dict[str, Any] = server.engine.describe()
    return ServerStatus(
        model=server.config.name, engine=type(server.engine).__name__, engine_info=engine, engine_state=state,
        policy_version=server.engine.policy_version, train_steps=c.train_steps, buffer=buffer,
        clients=sorted(server.registry.clients),
        throughput={**server.throughput.as_dict(), **server.tito.as_dict(),
                    "admission_capacity": server.episodes.capacity(),
                    "admission_refusals": server.episodes.admission_refusals,
                    "admission_reserved": server.episodes.reserved(),
                    "admission_waiting": len(server.episodes.admission_queue),
                    "admission_held": server.episodes.admission_held},
        eval_reward=eval_reward_by_version(server), last_train_metrics=c.last_metrics,
        task_types={t: {"episodes": v["episodes"], "reward_mean": v["reward_sum"] / max(v["episodes"], 1)}
                    for t, v in c.by_type.items()},
        config=server.config.public_dict(), training_halted=c.halted_reason)
