"""How the store's rows map to its records, each mapping written once: the episode columns (by the names of
``StoredEpisode``'s fields), a sample's blobs, a step's metrics, a count per status; and the one read of an
episode's samples, which the store and its adapters' lanes share."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from array import array
from collections.abc import Iterable
from typing import Any

from agentjet.server.store.records import StepRecord, StoredEpisode, StoredStatus
from agentjet.tracking import EpisodeSample

EPISODE_COLUMNS = tuple(f.name for f in dataclasses.fields(StoredEpisode))  # the episodes columns, by name


def episode_columns(alias: str = "") -> str:
    """The episodes columns of a ``StoredEpisode``, for a SELECT (``alias``: the table's alias in a join)."""
    return ", ".join(f"{alias}.{c}" if alias else c for c in EPISODE_COLUMNS)


def episode_of(r: sqlite3.Row) -> StoredEpisode:
    row = {name: r[name] for name in EPISODE_COLUMNS}
    return StoredEpisode(**{**row, "reward": json.loads(row["reward"]), "status": StoredStatus(row["status"]),
                            "commit_status": StoredStatus(row["commit_status"]) if row["commit_status"] else None})


def episode_values(ep: StoredEpisode, metadata: dict[str, Any], tracking: dict[str, Any] | None) -> tuple[Any, ...]:
    """The values of one ``INSERT INTO episodes`` (``EPISODE_INSERT_COLUMNS``)."""
    return (ep.episode_id, ep.key_hash, ep.client_id, ep.task_id, ep.task_type, ep.group_key,
            json.dumps(ep.reward), json.dumps(metadata, default=str), ep.status.value, ep.n_calls,
            ep.n_samples, ep.begin_policy_version, ep.min_policy_version, ep.ended_at,
            ep.commit_status.value if ep.commit_status else None, ep.team_id, ep.team_coordinator,
            ep.team_secret, json.dumps(tracking, default=str) if tracking is not None else None,
            ep.max_policy_version)


EPISODE_INSERT_COLUMNS = ("episode_id, key_hash, client_id, task_id, task_type, group_key, reward, metadata, status, "
                          "n_calls, n_samples, begin_policy_version, min_policy_version, ended_at, commit_status, "
                          "team_id, team_coordinator, team_secret, tracking, max_policy_version")
SAMPLE_INSERT_COLUMNS = ("episode_id, agent, temperature, min_policy_version, input_ids, loss_mask, logprobs, "
                         "call_indices, stats, weight, token_versions, adapter")


def sample_values(episode_id: str, s: EpisodeSample, adapter: str | None) -> tuple[Any, ...]:
    """The values of one ``INSERT INTO samples`` (``SAMPLE_INSERT_COLUMNS``)."""
    return (episode_id, s.agent, s.temperature, s.min_policy_version, array("q", s.input_ids).tobytes(),
            array("q", s.loss_mask).tobytes(), array("d", s.behaviour_logprobs).tobytes(),
            json.dumps(s.call_indices), json.dumps(s.stats, default=str), s.weight, array("q", s.versions).tobytes(),
            adapter)


def _ints(blob: bytes) -> list[int]:
    a = array("q")
    a.frombytes(blob)
    return a.tolist()


def _floats(blob: bytes) -> list[float]:
    a = array("d")
    a.frombytes(blob)
    return a.tolist()


def sample_of(r: sqlite3.Row) -> EpisodeSample:
    return EpisodeSample(
        input_ids=_ints(r["input_ids"]), loss_mask=_ints(r["loss_mask"]), behaviour_logprobs=_floats(r["logprobs"]),
        agent=r["agent"], temperature=r["temperature"], call_indices=json.loads(r["call_indices"]),
        min_policy_version=r["min_policy_version"], stats=json.loads(r["stats"]), weight=r["weight"],
        token_versions=_ints(r["token_versions"]) if r["token_versions"] is not None else None)


def read_samples(db: sqlite3.Connection, episode_ids: list[str],
                 adapter: str | None = None) -> dict[str, list[EpisodeSample]]:
    """Each episode's samples, in order (``adapter``: only the samples that adapter generated). The caller holds
    the connection's lock."""
    only = "" if adapter is None else " AND adapter=?"
    out: dict[str, list[EpisodeSample]] = {}
    for eid in episode_ids:
        rows = db.execute("SELECT agent, temperature, min_policy_version, input_ids, loss_mask, logprobs, "
                          f"call_indices, stats, weight, token_versions FROM samples WHERE episode_id=?{only} "
                          "ORDER BY id", (eid,) if adapter is None else (eid, adapter)).fetchall()
        out[eid] = [sample_of(r) for r in rows]
    return out


def step_of(r: sqlite3.Row) -> StepRecord:
    return StepRecord(r["step"], r["policy_version"], json.loads(r["metrics"]), r["created_at"])


def consumed_of(rows: Iterable[sqlite3.Row]) -> dict[str, list[int]]:
    """episode id -> the steps that consumed it, from ``(episode_id, consumed_step)`` rows."""
    out: dict[str, list[int]] = {}
    for r in rows:
        out.setdefault(r["episode_id"], []).append(r["consumed_step"])
    return out


def by_status(rows: Iterable[sqlite3.Row]) -> dict[str, int]:
    """Episodes per stored status from ``(status, n)`` rows: every status, 0 where none is stored."""
    counts = {s.value: 0 for s in StoredStatus}
    counts.update({r["status"]: r["n"] for r in rows})
    return counts
