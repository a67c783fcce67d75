"""The SQLite backend of ``SampleStore``: one file (WAL, ``synchronous=FULL``), one connection under one lock,
every statement in a method named for what it does. The guarantees are the interface's (``api.py``): an
episode is acknowledged only after its row and all its samples are committed; a step's episodes leave
``pending`` in the transaction that records the step; a rewind puts back what was consumed after a step."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentjet.server.digest import digest, matches
from agentjet.server.store.api import TrainingStore
from agentjet.server.store.lanes import SQLiteLane
from agentjet.server.store.records import StepRecord, StoredEpisode, StoredStatus, StoreError, TraceRow
from agentjet.server.store.rows import (
    EPISODE_INSERT_COLUMNS,
    SAMPLE_INSERT_COLUMNS,
    consumed_of,
    episode_columns,
    episode_of,
    episode_values,
    read_samples,
    sample_values,
    step_of,
)
from agentjet.server.store.schema import open_store
from agentjet.tracking import EpisodeSample

_COLS = episode_columns()


class SQLiteStore:
    """``SampleStore`` in one SQLite file; ``lane`` gives an adapter's view on the same connection."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn = open_store(path)

    def probe(self) -> None:
        try:
            with self._conn.transaction() as cur:
                cur.execute("CREATE TABLE IF NOT EXISTS probe (x INTEGER)")
                cur.execute("INSERT INTO probe VALUES (1)")
                cur.execute("DELETE FROM probe")
        except sqlite3.Error as exc:
            raise StoreError(f"the sample store cannot write: {exc}") from exc

    def close(self) -> None:
        self._conn.close()

    def lane(self, adapter: str) -> TrainingStore:
        return SQLiteLane(self._conn, adapter)

    # ----------------------------------------------------------------- episodes
    def commit_episode(self, ep: StoredEpisode, samples: list[EpisodeSample], metadata: dict[str, Any],
                       tracking: dict[str, Any] | None = None, adapters: Mapping[str, str] | None = None) -> bool:
        """Each sample records its adapter, and the episode gets one ``lane_episodes`` row per adapter it used
        (read through ``SQLiteLane``)."""
        adapters = adapters or {}
        try:
            with self._conn.transaction() as cur:
                if cur.execute("SELECT 1 FROM episodes WHERE episode_id=?", (ep.episode_id,)).fetchone():
                    return False  # nothing written
                cur.execute(f"INSERT INTO episodes ({EPISODE_INSERT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,"
                            "?,?,?)", episode_values(ep, metadata, tracking))
                cur.executemany(f"INSERT INTO samples ({SAMPLE_INSERT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                                [sample_values(ep.episode_id, s, adapters.get(s.agent)) for s in samples])
                cur.executemany("INSERT INTO lane_episodes VALUES (?,?,'pending',NULL)",
                                [(ep.episode_id, a) for a in sorted({adapters[s.agent] for s in samples
                                                                     if s.agent in adapters})])
        except sqlite3.Error as exc:
            raise StoreError(f"the sample store could not write episode {ep.episode_id}: {exc}") from exc
        return True

    def get_episode(self, episode_id: str) -> StoredEpisode | None:
        with self._conn.reading() as db:
            r = db.execute(f"SELECT {_COLS} FROM episodes WHERE episode_id=?", (episode_id,)).fetchone()
        return episode_of(r) if r else None

    def trace_row(self, episode_id: str) -> TraceRow | None:
        with self._conn.reading() as db:
            r = db.execute(f"SELECT {_COLS}, consumed_step, metadata, tracking FROM episodes WHERE episode_id=?",
                           (episode_id,)).fetchone()
        if r is None:
            return None
        return TraceRow(episode=episode_of(r), consumed_step=r["consumed_step"],
                        metadata=json.loads(r["metadata"]) if r["metadata"] else {},
                        report=json.loads(r["tracking"]) if r["tracking"] else None)

    def tracking_report(self, episode_id: str) -> dict[str, Any] | None:
        with self._conn.reading() as db:
            row = db.execute("SELECT tracking FROM episodes WHERE episode_id=?", (episode_id,)).fetchone()
        return json.loads(row["tracking"]) if row and row["tracking"] else None

    def episode_adapters(self, episode_id: str) -> list[str]:
        with self._conn.reading() as db:
            rows = db.execute("SELECT adapter FROM lane_episodes WHERE episode_id=? ORDER BY adapter",
                              (episode_id,)).fetchall()
        return [r["adapter"] for r in rows]

    def _with_status(self, status: StoredStatus) -> list[StoredEpisode]:
        with self._conn.reading() as db:
            rows = db.execute(f"SELECT {_COLS} FROM episodes WHERE status=? ORDER BY seq", (status.value,)).fetchall()
        return [episode_of(r) for r in rows]

    # ----------------------------------------------------------------- teams (two-phase commit)
    def prepared_episodes(self) -> list[StoredEpisode]:
        return self._with_status(StoredStatus.PREPARED)

    def resolve_prepared(self, episode_id: str, commit: bool) -> tuple[StoredEpisode, bool]:
        with self._conn.transaction() as cur:
            r = cur.execute(f"SELECT {_COLS} FROM episodes WHERE episode_id=?", (episode_id,)).fetchone()
            if r is None:
                raise KeyError(episode_id)
            ep = episode_of(r)
            if ep.status is not StoredStatus.PREPARED:
                return ep, False
            if ep.team_coordinator is None and ep.team_id:  # the coordinator decides for the team
                row = cur.execute("SELECT decision FROM teams WHERE team_id=?", (ep.team_id,)).fetchone()
                if row is not None:
                    commit = row["decision"] == "committed"  # decided before (e.g. expired): keep it
                else:
                    cur.execute("INSERT INTO teams VALUES (?,?,?,?)", (
                        ep.team_id, digest(ep.team_secret or ""), "committed" if commit else "aborted", time.time()))
            new = (ep.commit_status or StoredStatus.PENDING) if commit else StoredStatus.ABORTED
            cur.execute("UPDATE episodes SET status=? WHERE episode_id=?", (new.value, episode_id))
            return episode_of(cur.execute(f"SELECT {_COLS} FROM episodes WHERE episode_id=?",
                                          (episode_id,)).fetchone()), True

    def team_decision(self, team_id: str, secret: str) -> str | None:
        with self._conn.reading() as db:
            row = db.execute("SELECT secret_hash, decision FROM teams WHERE team_id=?", (team_id,)).fetchone()
        if row is None or not matches(secret, row["secret_hash"]):
            return None
        return str(row["decision"])

    # ----------------------------------------------------------------- training (the one policy)
    def pending_episodes(self) -> list[StoredEpisode]:
        return self._with_status(StoredStatus.PENDING)

    def samples_for(self, episode_ids: list[str]) -> dict[str, list[EpisodeSample]]:
        with self._conn.reading() as db:
            return read_samples(db, episode_ids)

    def mark_consumed(self, statuses: dict[str, StoredStatus], step: int | None,
                      step_record: tuple[int, dict[str, float]] | None = None) -> None:
        with self._conn.transaction() as cur:
            cur.executemany("UPDATE episodes SET status=?, consumed_step=? WHERE episode_id=? AND status='pending'",
                            [(st.value, step, eid) for eid, st in statuses.items()])
            if step_record is not None and step is not None:
                version, metrics = step_record
                cur.execute("INSERT OR REPLACE INTO steps VALUES (?,?,?,?)",
                            (step, version, json.dumps(metrics), time.time()))

    def rewind_to_step(self, step: int) -> int:
        with self._conn.transaction() as cur:
            rewound = cur.execute("UPDATE episodes SET status='pending', consumed_step=NULL "
                                  "WHERE consumed_step IS NOT NULL AND consumed_step > ?", (step,)).rowcount
            cur.execute("DELETE FROM steps WHERE step > ?", (step,))
        return rewound

    def consumed_steps(self) -> dict[str, list[int]]:
        with self._conn.reading() as db:
            return consumed_of(db.execute("SELECT episode_id, consumed_step FROM episodes "
                                          "WHERE consumed_step IS NOT NULL").fetchall())

    def step_metrics(self) -> list[StepRecord]:
        with self._conn.reading() as db:
            rows = db.execute("SELECT step, policy_version, metrics, created_at FROM steps ORDER BY step").fetchall()
        return [step_of(r) for r in rows]
