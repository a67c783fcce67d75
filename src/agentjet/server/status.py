"""What ``GET /swarm/v1/status`` reports: the engine and where it runs, the policy version, buffer counts,
clients, throughput, eval reward per policy version, the last train metrics, per-task-type figures and the
public settings."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from agentjet.protocol import BufferCounts, ServerStatus, reward_mean
from agentjet.server.run_state import RunParts


def eval_reward_by_version(run: RunParts) -> dict[str, float]:
    sums: dict[int, list[float]] = defaultdict(list)
    for version, reward in run.store.eval_rewards():
        sums[version].append(reward_mean(reward))
    return {str(v): sum(rs) / len(rs) for v, rs in sorted(sums.items())}


def build_status(run: RunParts) -> ServerStatus:
    counts = run.store.count_by_status()
    c = run.trainer.counters
    buffer = BufferCounts(
        open_episodes=run.registry.open_count, pending_episodes=counts["pending"],
        trained_episodes=counts["trained"], dropped_stale_episodes=counts["dropped_stale"],
        dropped_uniform_episodes=counts["dropped_uniform"], expired_episodes=run.registry.counts["expired"],
        aborted_episodes=run.registry.counts["aborted"], eval_episodes=counts["eval"])
    engine: dict[str, Any] = run.engine.describe()
    return ServerStatus(
        model=run.config.name, engine=run.engine.layout, engine_info=engine, engine_state=run.engine_state(),
        policy_version=run.engine.policy_version, train_steps=c.train_steps, buffer=buffer,
        clients=sorted(run.registry.clients),
        throughput={**run.throughput.as_dict(), **run.tito.as_dict(),
                    "admission_capacity": run.episodes.capacity(),
                    "admission_refusals": run.episodes.admission_refusals,
                    "admission_reserved": run.episodes.reserved(),
                    "admission_waiting": len(run.episodes.admission_queue),
                    "admission_held": run.episodes.admission_held},
        eval_reward=eval_reward_by_version(run), last_train_metrics=c.last_metrics,
        task_types={t: {"episodes": v["episodes"], "reward_mean": v["reward_sum"] / max(v["episodes"], 1)}
                    for t, v in c.by_type.items()},
        config=run.config.public_dict(), training_halted=c.halted_reason)
