"""Run a verifiers environment's episodes against a swarm server (``ajet verifiers``).

Each episode begins on the swarm (AgentJet's client: groups, heartbeats, retries), runs through verifiers in the
worker with the episode's base URL and key, and ends with the environment's own reward; an episode that verifiers
could not score is aborted, so nothing half-done is trained on. Each of the taskset's tasks is one GRPO group.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

from agentjet.apps.verifiers.bridge import EpisodeOutcome, VerifiersTask, VerifiersWorker
from agentjet.client.client import Episode, SwarmClient
from agentjet.client.runner import RunSummary, Workflow, run_workflow


@dataclass
class EpisodeRecord:
    """One episode, from both sides: the swarm's acknowledgement and verifiers' scoring."""

    task_id: str
    task_index: int
    task_name: str | None
    episode_id: str | None = None
    begin_policy_version: int | None = None
    reward: float | None = None  # what verifiers scored, and what the swarm episode ended with
    rewards: dict[str, Any] = field(default_factory=dict)  # the trace's named rewards (score, weight)
    reply: str | None = None  # the agent's last reply, as verifiers saw it
    harness: str | None = None  # the harness and runtime verifiers ran the agent with
    runtime: str | None = None
    acknowledged: bool = False
    calls: int = 0
    samples: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class VerifiersReport:
    env_id: str
    verifiers_version: str
    tasks: int
    group_size: int
    episodes: int
    acknowledged: int
    failed: int
    mean_reward: float | None
    policy_version_before: int
    policy_version_after: int
    records: list[EpisodeRecord]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def swarm_tasks(env_id: str, tasks: list[VerifiersTask]) -> list[dict[str, Any]]:
    """The runner's task dicts: a task id from the environment and the task's key (so the same task is the same
    GRPO group in every run), the env id as the task type, and the worker's index."""
    out = []
    for t in tasks:
        digest = hashlib.sha256(f"{env_id}\0{t.key}".encode()).hexdigest()[:16]
        out.append({"task_id": f"vf-{env_id}-{digest}", "task_type": env_id, "index": t.index, "name": t.name})
    return out


def record_of(task: dict[str, Any], ep: Episode, outcome: EpisodeOutcome | None) -> EpisodeRecord:
    record = EpisodeRecord(task_id=str(task["task_id"]), task_index=int(task["index"]), task_name=task.get("name"))
    if ep.info is not None:
        record.episode_id, record.begin_policy_version = ep.episode_id, ep.policy_version
    if outcome is not None:
        record.reward, record.errors = outcome.reward, list(outcome.errors)
        if outcome.traces:
            record.rewards = dict(outcome.traces[0].get("rewards") or {})
            record.reply = outcome.traces[-1].get("reply")
            record.harness, record.runtime = outcome.traces[0].get("harness"), outcome.traces[0].get("runtime")
    if ep.result is not None:
        record.acknowledged, record.calls, record.samples = ep.result.acknowledged, ep.result.calls, ep.result.samples
    return record


def verifiers_workflow(worker: VerifiersWorker, seen: list[tuple[dict[str, Any], Episode, list[EpisodeOutcome]]]
                       ) -> Workflow:
    """The runner's workflow: one verifiers episode with this swarm episode's URL and key; its reward is the
    environment's. A failed verifiers episode raises, and the runner aborts the swarm episode."""

    async def workflow(task: dict[str, Any], ep: Episode) -> float:
        outcomes: list[EpisodeOutcome] = []
        seen.append((task, ep, outcomes))
        outcome = await worker.episode(int(task["index"]), ep.base_url, ep.api_key)
        outcomes.append(outcome)
        return outcome.require_reward()

    return workflow


async def run_verifiers(client: SwarmClient, worker: VerifiersWorker, *, group_size: int | None = None,
                        concurrency: int = 4, epochs: int = 1) -> VerifiersReport:
    """``epochs`` passes over the worker's tasks, ``group_size`` episodes per task (default: the server's)."""
    before = (await client.status()).policy_version
    size = client.group_size(group_size)
    tasks = swarm_tasks(worker.env_id, worker.tasks)
    seen: list[tuple[dict[str, Any], Episode, list[EpisodeOutcome]]] = []
    summary = RunSummary()
    for _ in range(epochs):
        summary.merge(await run_workflow(client, verifiers_workflow(worker, seen), tasks, group_size=size,
                                         concurrency=concurrency))
    after = (await client.status()).policy_version
    records = [record_of(task, ep, outcomes[0] if outcomes else None) for task, ep, outcomes in seen]
    return VerifiersReport(env_id=worker.env_id, verifiers_version=worker.verifiers_version, tasks=len(tasks),
                           group_size=size, episodes=summary.episodes,
                           acknowledged=sum(r.acknowledged for r in records), failed=summary.failed,
                           mean_reward=summary.mean_reward if summary.rewards else None,
                           policy_version_before=before, policy_version_after=after, records=records)
