"""What ``GET /swarm/v1/status`` reports, rendered from the run's one snapshot (``run_state.snapshot``): the
engine and where it runs, the served policy version (the learner's beside it), buffer counts, clients, throughput and admission, weight syncs,
eval reward per policy version, the last train metrics, per-task-type figures, the generator replicas and the router's
counts (a fleet), and the public settings."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from agentjet.observe.schema import DropReason, RunSnapshot
from agentjet.protocol import BufferCounts, ServerStatus, reward_mean
from agentjet.server.store import StoreReader


def eval_reward_by_version(reader: StoreReader) -> dict[str, float]:
    sums: dict[int, list[float]] = defaultdict(list)
    for e in reader.eval_rewards():
        sums[e.policy_version].append(reward_mean(e.reward))
    return {str(v): sum(rs) / len(rs) for v, rs in sorted(sums.items())}


def build_status(snap: RunSnapshot, eval_reward: dict[str, float], config: dict[str, Any]) -> ServerStatus:
    buffer = BufferCounts(
        open_episodes=snap.open_episodes, pending_episodes=snap.pending_episodes,
        trained_episodes=snap.trained_episodes, dropped_stale_episodes=snap.dropped[DropReason.STALE],
        dropped_uniform_episodes=snap.dropped[DropReason.UNIFORM], expired_episodes=snap.dropped[DropReason.EXPIRED],
        aborted_episodes=snap.dropped[DropReason.ABORTED], eval_episodes=snap.eval_episodes)
    throughput = {"uptime_s": snap.uptime_s, "calls": snap.calls, "generated_tokens": snap.generated_tokens,
                  "episodes_ended": snap.episodes_ended, "calls_per_s": snap.calls / snap.uptime_s,
                  "tokens_per_s": snap.generated_tokens / snap.uptime_s, "trained_tokens": snap.trained_tokens,
                  "train_seconds": snap.train_seconds, "weight_sync_seconds": snap.weight_sync_seconds, **snap.tito,
                  **{f"admission_{k}": v for k, v in snap.admission.items()},
                  **{f"generator_{k}": v for k, v in snap.generator.items()}}
    return ServerStatus(
        model=snap.model, engine=snap.engine, engine_info=snap.engine_info, engine_state=snap.engine_state,
        policy_version=snap.policy_version, learner_version=snap.learner_version,
        weight_push_in_flight=snap.weight_push_in_flight, train_steps=snap.train_steps, buffer=buffer, clients=snap.client_ids,
        throughput=throughput, eval_reward=eval_reward, last_train_metrics=snap.last_train_metrics,
        task_types=snap.task_types, levels=snap.levels, config=config, training_halted=snap.training_halted,
        weight_syncs=snap.weight_syncs, weight_sync_failures=snap.weight_sync_failures, adapters=snap.adapters,
        tinker=snap.tinker, fleet=snap.fleet)
