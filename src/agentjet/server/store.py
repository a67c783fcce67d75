"""Durable sample store (SQLite, WAL, synchronous=FULL).

An episode is acknowledged only after its row and all its samples are committed. Each episode row moves
``pending`` -> ``trained`` | ``dropped_stale`` | ``dropped_uniform`` exactly once, in the same
transaction that records the train step which consumed it. Eval episodes are stored as ``eval``.
On resume from a checkpoint taken at step k, episodes consumed after step k go back to ``pending``.
"""

from __future__ import annotations

import enum
import json
import sqlite3
import threading
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentjet.server.digest import digest, matches
from agentjet.storage import open_wal_db
from agentjet.tracking import EpisodeSample


class StoredStatus(enum.StrEnum):
    PENDING = "pending"
    TRAINED = "trained"
    DROPPED_STALE = "dropped_stale"
    DROPPED_UNIFORM = "dropped_uniform"
    EVAL = "eval"
    PREPARED = "prepared"  # team episode after phase one: durable, not trainable until committed
    ABORTED = "aborted"  # a prepared team episode whose team aborted


_SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  episode_id TEXT UNIQUE NOT NULL,
  key_hash TEXT NOT NULL,
  client_id TEXT NOT NULL,
  task_id TEXT NOT NULL,
  task_type TEXT NOT NULL,
  group_key TEXT NOT NULL,
  reward TEXT NOT NULL,
  metadata TEXT NOT NULL,
  status TEXT NOT NULL,
  n_calls INTEGER NOT NULL,
  n_samples INTEGER NOT NULL,
  begin_policy_version INTEGER NOT NULL,
  min_policy_version INTEGER NOT NULL,
  ended_at REAL NOT NULL,
  consumed_step INTEGER,
  commit_status TEXT,
  team_id TEXT,
  team_coordinator TEXT,
  team_secret TEXT,
  tracking TEXT
);
CREATE INDEX IF NOT EXISTS episodes_status ON episodes(status);
CREATE TABLE IF NOT EXISTS samples (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  episode_id TEXT NOT NULL REFERENCES episodes(episode_id),
  agent TEXT NOT NULL,
  temperature REAL NOT NULL,
  min_policy_version INTEGER NOT NULL,
  input_ids BLOB NOT NULL,
  loss_mask BLOB NOT NULL,
  logprobs BLOB NOT NULL,
  call_indices TEXT NOT NULL,
  stats TEXT NOT NULL,
  weight REAL NOT NULL DEFAULT 1.0
);
CREATE INDEX IF NOT EXISTS samples_episode ON samples(episode_id);
CREATE TABLE IF NOT EXISTS teams (
  team_id TEXT PRIMARY KEY,
  secret_hash TEXT NOT NULL,
  decision TEXT NOT NULL,
  decided_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS steps (
  step INTEGER PRIMARY KEY,
  policy_version INTEGER NOT NULL,
  metrics TEXT NOT NULL,
  created_at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class StoredEpisode:
    episode_id: str
    key_hash: str
    client_id: str
    task_id: str
    task_type: str
    group_key: str
    reward: float | dict[str, float]
    status: StoredStatus
    n_calls: int
    n_samples: int
    begin_policy_version: int
    min_policy_version: int
    ended_at: float
    commit_status: StoredStatus | None = None  # for PREPARED: what it becomes on commit (pending or eval)
    team_id: str | None = None
    team_coordinator: str | None = None  # None on the coordinator itself
    team_secret: str | None = None


def _ints(blob: bytes) -> list[int]:
    a = array("q")
    a.frombytes(blob)
    return a.tolist()


def _floats(blob: bytes) -> list[float]:
    a = array("d")
    a.frombytes(blob)
    return a.tolist()


class StoreError(RuntimeError):
    """The store cannot durably accept data (disk full, read-only, ...)."""


class SampleStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = open_wal_db(path, _SCHEMA, synchronous="FULL")  # an acknowledged episode survives a crash
        self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        """A data dir written by an earlier version lacks the newer columns (CREATE TABLE IF NOT EXISTS keeps the
        old table): add them, so --resume after an upgrade does not fail every end and every train step."""
        want = sqlite3.connect(":memory:")
        try:
            want.executescript(_SCHEMA)
            tables = [r[0] for r in want.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                                 "AND name NOT LIKE 'sqlite_%'")]
            for table in tables:
                have = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
                for _, name, typ, notnull, default, _ in want.execute(f"PRAGMA table_info({table})"):
                    if name not in have:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {typ}"
                                         + (" NOT NULL" if notnull else "")
                                         + (f" DEFAULT {default}" if default is not None else ""))
        finally:
            want.close()

    def probe(self) -> None:
        """Raise StoreError unless a durable write works right now (disk full, read-only, ...)."""
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("CREATE TABLE IF NOT EXISTS probe (x INTEGER)")
                self._db.execute("INSERT INTO probe VALUES (1)")
                self._db.execute("DELETE FROM probe")
                self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            with self._lock:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
            raise StoreError(f"the sample store cannot write: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ----------------------------------------------------------------- writes
    def commit_episode(self, ep: StoredEpisode, samples: list[EpisodeSample], metadata: dict[str, Any],
                       tracking: dict[str, Any] | None = None) -> bool:
        """Durably store an ended episode. Returns False if it was already stored (idempotent)."""
        row = (ep.episode_id, ep.key_hash, ep.client_id, ep.task_id, ep.task_type, ep.group_key,
               json.dumps(ep.reward), json.dumps(metadata, default=str), ep.status.value, ep.n_calls,
               ep.n_samples, ep.begin_policy_version, ep.min_policy_version, ep.ended_at,
               ep.commit_status.value if ep.commit_status else None, ep.team_id, ep.team_coordinator,
               ep.team_secret, json.dumps(tracking, default=str) if tracking is not None else None)
        try:
            with self._lock:
                cur = self._db.cursor()
                cur.execute("BEGIN IMMEDIATE")
                try:
                    if cur.execute("SELECT 1 FROM episodes WHERE episode_id=?", (ep.episode_id,)).fetchone():
                        cur.execute("ROLLBACK")
                        return False
                    cur.execute(
                        "INSERT INTO episodes (episode_id, key_hash, client_id, task_id, task_type, group_key, "
                        "reward, metadata, status, n_calls, n_samples, begin_policy_version, min_policy_version, "
                        "ended_at, commit_status, team_id, team_coordinator, team_secret, tracking) "
                        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", row)
                    cur.executemany(
                        "INSERT INTO samples (episode_id, agent, temperature, min_policy_version, input_ids, "
                        "loss_mask, logprobs, call_indices, stats, weight) VALUES (?,?,?,?,?,?,?,?,?,?)",
                        [(ep.episode_id, s.agent, s.temperature, s.min_policy_version,
                          array("q", s.input_ids).tobytes(), array("q", s.loss_mask).tobytes(),
                          array("d", s.behaviour_logprobs).tobytes(), json.dumps(s.call_indices),
                          json.dumps(s.stats, default=str), s.weight) for s in samples])
                    cur.execute("COMMIT")
                except BaseException:
                    cur.execute("ROLLBACK")
                    raise
        except sqlite3.Error as exc:
            raise StoreError(f"the sample store could not write episode {ep.episode_id}: {exc}") from exc
        return True

    def mark_consumed(self, statuses: dict[str, StoredStatus], step: int | None,
                      step_record: tuple[int, dict[str, float]] | None = None) -> None:
        """Move pending episodes to their final status, together with the step that consumed them."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                cur.executemany(
                    "UPDATE episodes SET status=?, consumed_step=? WHERE episode_id=? AND status='pending'",
                    [(st.value, step, eid) for eid, st in statuses.items()])
                if step_record is not None and step is not None:
                    version, metrics = step_record
                    cur.execute("INSERT OR REPLACE INTO steps VALUES (?,?,?,?)",
                                (step, version, json.dumps(metrics), time.time()))
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise

    def resolve_prepared(self, episode_id: str, commit: bool) -> tuple[StoredEpisode, bool]:
        """Phase two: a prepared episode becomes trainable (commit) or aborted. On the coordinator, the team's
        decision is recorded in the same transaction. Idempotent: returns (episode, whether this call changed it)."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                r = cur.execute(f"SELECT {self._COLS} FROM episodes WHERE episode_id=?", (episode_id,)).fetchone()
                if r is None:
                    raise KeyError(episode_id)
                ep = self._episode(r)
                if ep.status is StoredStatus.PREPARED:
                    if ep.team_coordinator is None and ep.team_id:  # the coordinator decides for the team
                        row = cur.execute("SELECT decision FROM teams WHERE team_id=?", (ep.team_id,)).fetchone()
                        if row is not None:
                            commit = row[0] == "committed"  # decided before (e.g. expired): keep it
                        else:
                            cur.execute("INSERT INTO teams VALUES (?,?,?,?)", (
                                ep.team_id, digest(ep.team_secret or ""), "committed" if commit else "aborted",
                                time.time()))
                    new = (ep.commit_status or StoredStatus.PENDING) if commit else StoredStatus.ABORTED
                    cur.execute("UPDATE episodes SET status=? WHERE episode_id=?", (new.value, episode_id))
                    ep = self._episode(cur.execute(f"SELECT {self._COLS} FROM episodes WHERE episode_id=?",
                                                   (episode_id,)).fetchone())
                    cur.execute("COMMIT")
                    return ep, True
                cur.execute("COMMIT")
                return ep, False
            except BaseException:
                cur.execute("ROLLBACK")
                raise

    def team_decision(self, team_id: str, secret: str) -> str | None:
        """The coordinator's decision for a team ('committed' / 'aborted'); None while undecided or when the
        secret does not match."""
        with self._lock:
            row = self._db.execute("SELECT secret_hash, decision FROM teams WHERE team_id=?", (team_id,)).fetchone()
        if row is None or not matches(secret, row[0]):
            return None
        return row[1]

    def prepared_episodes(self) -> list[StoredEpisode]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {self._COLS} FROM episodes WHERE status='prepared' ORDER BY seq").fetchall()
        return [self._episode(r) for r in rows]

    def rewind_to_step(self, step: int) -> int:
        """Resume support: episodes consumed after ``step`` were not in the checkpointed weights."""
        with self._lock:
            cur = self._db.execute(
                "UPDATE episodes SET status='pending', consumed_step=NULL "
                "WHERE consumed_step IS NOT NULL AND consumed_step > ?", (step,))
            self._db.execute("DELETE FROM steps WHERE step > ?", (step,))
            return cur.rowcount

    # ----------------------------------------------------------------- reads
    def _episode(self, r: tuple) -> StoredEpisode:
        return StoredEpisode(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), StoredStatus(r[7]),
                             r[8], r[9], r[10], r[11], r[12], StoredStatus(r[13]) if r[13] else None, r[14], r[15],
                             r[16])

    _COLS = ("episode_id, key_hash, client_id, task_id, task_type, group_key, reward, status, n_calls, "
             "n_samples, begin_policy_version, min_policy_version, ended_at, commit_status, team_id, "
             "team_coordinator, team_secret")

    def get_episode(self, episode_id: str) -> StoredEpisode | None:
        with self._lock:
            r = self._db.execute(f"SELECT {self._COLS} FROM episodes WHERE episode_id=?", (episode_id,)).fetchone()
        return self._episode(r) if r else None

    def tracking_report(self, episode_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT tracking FROM episodes WHERE episode_id=?", (episode_id,)).fetchone()
        return json.loads(row[0]) if row and row[0] else None

    def pending_episodes(self) -> list[StoredEpisode]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {self._COLS} FROM episodes WHERE status='pending' ORDER BY seq").fetchall()
        return [self._episode(r) for r in rows]

    def samples_for(self, episode_ids: list[str]) -> dict[str, list[EpisodeSample]]:
        out: dict[str, list[EpisodeSample]] = {e: [] for e in episode_ids}
        with self._lock:
            for eid in episode_ids:
                rows = self._db.execute(
                    "SELECT agent, temperature, min_policy_version, input_ids, loss_mask, logprobs, call_indices, "
                    "stats, weight FROM samples WHERE episode_id=? ORDER BY id", (eid,)).fetchall()
                out[eid] = [EpisodeSample(
                    input_ids=_ints(r[3]), loss_mask=_ints(r[4]), behaviour_logprobs=_floats(r[5]), agent=r[0],
                    temperature=r[1], call_indices=json.loads(r[6]), min_policy_version=r[2],
                    stats=json.loads(r[7]), weight=r[8]) for r in rows]
        return out

    def count_by_status(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT status, COUNT(*) FROM episodes GROUP BY status").fetchall()
        counts = {s.value: 0 for s in StoredStatus}
        counts.update({r[0]: r[1] for r in rows})
        return counts

    def eval_rewards(self) -> list[tuple[int, float | dict[str, float]]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT begin_policy_version, reward FROM episodes WHERE status='eval' ORDER BY seq").fetchall()
        return [(r[0], json.loads(r[1])) for r in rows]

    def consumed_steps(self) -> dict[str, list[int]]:
        """episode id -> the steps that consumed it (for exactly-once audits: each list has length 1)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT episode_id, consumed_step FROM episodes WHERE consumed_step IS NOT NULL").fetchall()
        out: dict[str, list[int]] = {}
        for eid, step in rows:
            out.setdefault(eid, []).append(step)
        return out

    def step_metrics(self) -> list[tuple[int, int, dict[str, float], float]]:
        with self._lock:
            rows = self._db.execute("SELECT step, policy_version, metrics, created_at FROM steps ORDER BY step").fetchall()
        return [(r[0], r[1], json.loads(r[2]), r[3]) for r in rows]
