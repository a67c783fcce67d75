"""Durable sample store (SQLite, WAL, synchronous=FULL).

An episode is acknowledged only after its row and all its samples are committed. Each episode row moves
``pending`` -> ``trained`` | ``dropped_stale`` | ``dropped_uniform`` exactly once, in the same
transaction that records the train step which consumed it. Eval episodes are stored as ``eval``.
On resume from a checkpoint taken at step k, episodes consumed after step k go back to ``pending``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import sqlite3
import threading
import time
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agentjet.runtime.storage import open_wal_db
from agentjet.server.digest import digest, matches
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
  tracking TEXT,
  max_policy_version INTEGER
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
  weight REAL NOT NULL DEFAULT 1.0,
  token_versions BLOB,
  adapter TEXT
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
CREATE TABLE IF NOT EXISTS lane_episodes (
  episode_id TEXT NOT NULL REFERENCES episodes(episode_id),
  adapter TEXT NOT NULL,
  status TEXT NOT NULL,
  consumed_step INTEGER,
  PRIMARY KEY (episode_id, adapter)
);
CREATE INDEX IF NOT EXISTS lane_episodes_adapter ON lane_episodes(adapter, status);
CREATE TABLE IF NOT EXISTS lane_steps (
  adapter TEXT NOT NULL,
  step INTEGER NOT NULL,
  policy_version INTEGER NOT NULL,
  metrics TEXT NOT NULL,
  created_at REAL NOT NULL,
  PRIMARY KEY (adapter, step)
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
    # The newest policy version that generated any of its tokens (None: stored before it was kept; then
    # ``min_policy_version`` stands for every token).
    max_policy_version: int | None = None

    @property
    def newest_version(self) -> int:
        return self.max_policy_version if self.max_policy_version is not None else self.min_policy_version


@dataclass(frozen=True)
class TraceRow:
    episode: StoredEpisode
    consumed_step: int | None
    metadata: dict[str, Any]
    report: dict[str, Any] | None  # the tracking report (merge and drift statistics)


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
        self._db.row_factory = sqlite3.Row  # every row is read by column name
        self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        """A data dir written by an earlier version lacks the newer columns (CREATE TABLE IF NOT EXISTS keeps the
        old table): add them, so --resume after an upgrade does not fail every end and every train step."""
        want = sqlite3.connect(":memory:")
        want.row_factory = sqlite3.Row
        try:
            want.executescript(_SCHEMA)
            tables = [r["name"] for r in want.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                                      "AND name NOT LIKE 'sqlite_%'")]
            for table in tables:
                have = {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}
                for col in want.execute(f"PRAGMA table_info({table})"):
                    if col["name"] not in have:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {col['name']} {col['type']}"
                                         + (" NOT NULL" if col["notnull"] else "")
                                         + (f" DEFAULT {col['dflt_value']}" if col["dflt_value"] is not None
                                            else ""))
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
                       tracking: dict[str, Any] | None = None, adapters: Mapping[str, str] | None = None) -> bool:
        """Durably store an ended episode. Returns False if it was already stored (idempotent).

        ``adapters`` (a server with several LoRA adapters): agent -> the adapter that generated its calls. Each
        sample records its adapter, and the episode waits to be consumed once by each adapter it used
        (``lane_episodes``, read through ``LaneStore``)."""
        adapters = adapters or {}
        row = (ep.episode_id, ep.key_hash, ep.client_id, ep.task_id, ep.task_type, ep.group_key,
               json.dumps(ep.reward), json.dumps(metadata, default=str), ep.status.value, ep.n_calls,
               ep.n_samples, ep.begin_policy_version, ep.min_policy_version, ep.ended_at,
               ep.commit_status.value if ep.commit_status else None, ep.team_id, ep.team_coordinator,
               ep.team_secret, json.dumps(tracking, default=str) if tracking is not None else None,
               ep.max_policy_version)
        try:
            with self.transaction() as cur:
                if cur.execute("SELECT 1 FROM episodes WHERE episode_id=?", (ep.episode_id,)).fetchone():
                    return False  # nothing written
                cur.execute(
                    "INSERT INTO episodes (episode_id, key_hash, client_id, task_id, task_type, group_key, "
                    "reward, metadata, status, n_calls, n_samples, begin_policy_version, min_policy_version, "
                    "ended_at, commit_status, team_id, team_coordinator, team_secret, tracking, "
                    "max_policy_version) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", row)
                cur.executemany(
                    "INSERT INTO samples (episode_id, agent, temperature, min_policy_version, input_ids, "
                    "loss_mask, logprobs, call_indices, stats, weight, token_versions, adapter) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    [(ep.episode_id, s.agent, s.temperature, s.min_policy_version,
                      array("q", s.input_ids).tobytes(), array("q", s.loss_mask).tobytes(),
                      array("d", s.behaviour_logprobs).tobytes(), json.dumps(s.call_indices),
                      json.dumps(s.stats, default=str), s.weight, array("q", s.versions).tobytes(),
                      adapters.get(s.agent)) for s in samples])
                cur.executemany("INSERT INTO lane_episodes VALUES (?,?,'pending',NULL)",
                                [(ep.episode_id, a) for a in sorted({adapters[s.agent] for s in samples
                                                                     if s.agent in adapters})])
        except sqlite3.Error as exc:
            raise StoreError(f"the sample store could not write episode {ep.episode_id}: {exc}") from exc
        return True

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction under the store's lock: ``BEGIN IMMEDIATE``, then ``COMMIT``, or ``ROLLBACK`` on
        any error (the store's own writes and the adapters' views of it, ``LaneStore``)."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        """Rows of one read under the store's lock."""
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def mark_consumed(self, statuses: dict[str, StoredStatus], step: int | None,
                      step_record: tuple[int, dict[str, float]] | None = None) -> None:
        """Move pending episodes to their final status, together with the step that consumed them."""
        with self.transaction() as cur:
            cur.executemany("UPDATE episodes SET status=?, consumed_step=? WHERE episode_id=? AND status='pending'",
                            [(st.value, step, eid) for eid, st in statuses.items()])
            if step_record is not None and step is not None:
                version, metrics = step_record
                cur.execute("INSERT OR REPLACE INTO steps VALUES (?,?,?,?)",
                            (step, version, json.dumps(metrics), time.time()))

    def resolve_prepared(self, episode_id: str, commit: bool) -> tuple[StoredEpisode, bool]:
        """Phase two: a prepared episode becomes trainable (commit) or aborted. On the coordinator, the team's
        decision is recorded in the same transaction. Idempotent: returns (episode, whether this call changed it)."""
        with self.transaction() as cur:
            r = cur.execute(f"SELECT {self._COLS} FROM episodes WHERE episode_id=?", (episode_id,)).fetchone()
            if r is None:
                raise KeyError(episode_id)
            ep = self._episode(r)
            if ep.status is StoredStatus.PREPARED:
                if ep.team_coordinator is None and ep.team_id:  # the coordinator decides for the team
                    row = cur.execute("SELECT decision FROM teams WHERE team_id=?", (ep.team_id,)).fetchone()
                    if row is not None:
                        commit = row["decision"] == "committed"  # decided before (e.g. expired): keep it
                    else:
                        cur.execute("INSERT INTO teams VALUES (?,?,?,?)", (
                            ep.team_id, digest(ep.team_secret or ""), "committed" if commit else "aborted",
                            time.time()))
                new = (ep.commit_status or StoredStatus.PENDING) if commit else StoredStatus.ABORTED
                cur.execute("UPDATE episodes SET status=? WHERE episode_id=?", (new.value, episode_id))
                ep = self._episode(cur.execute(f"SELECT {self._COLS} FROM episodes WHERE episode_id=?",
                                               (episode_id,)).fetchone())
                return ep, True
            return ep, False

    def team_decision(self, team_id: str, secret: str) -> str | None:
        """The coordinator's decision for a team ('committed' / 'aborted'); None while undecided or when the
        secret does not match."""
        with self._lock:
            row = self._db.execute("SELECT secret_hash, decision FROM teams WHERE team_id=?", (team_id,)).fetchone()
        if row is None or not matches(secret, row["secret_hash"]):
            return None
        return str(row["decision"])

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
    _COL_NAMES = tuple(f.name for f in dataclasses.fields(StoredEpisode))  # the episodes columns, by name
    _COLS = ", ".join(_COL_NAMES)

    def episodes_where(self, sql: str, args: tuple[Any, ...] = ()) -> list[StoredEpisode]:
        """The episodes of ``SELECT <every column of e> FROM episodes e <sql>`` (joins, conditions, order)."""
        cols = ", ".join(f"e.{c}" for c in self._COL_NAMES)
        return [self._episode(r) for r in self.query(f"SELECT {cols} FROM episodes e {sql}", args)]

    def _episode(self, r: sqlite3.Row) -> StoredEpisode:
        row = {name: r[name] for name in self._COL_NAMES}
        return StoredEpisode(**{**row, "reward": json.loads(row["reward"]), "status": StoredStatus(row["status"]),
                                "commit_status": StoredStatus(row["commit_status"]) if row["commit_status"] else None})

    def get_episode(self, episode_id: str) -> StoredEpisode | None:
        with self._lock:
            r = self._db.execute(f"SELECT {self._COLS} FROM episodes WHERE episode_id=?", (episode_id,)).fetchone()
        return self._episode(r) if r else None

    def trace_row(self, episode_id: str) -> TraceRow | None:
        """A stored episode with what its trace shows besides the samples (None: not stored)."""
        with self._lock:
            r = self._db.execute(f"SELECT {self._COLS}, consumed_step, metadata, tracking FROM episodes "
                                 "WHERE episode_id=?", (episode_id,)).fetchone()
        if r is None:
            return None
        return TraceRow(episode=self._episode(r), consumed_step=r["consumed_step"],
                        metadata=json.loads(r["metadata"]) if r["metadata"] else {},
                        report=json.loads(r["tracking"]) if r["tracking"] else None)

    def tracking_report(self, episode_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT tracking FROM episodes WHERE episode_id=?", (episode_id,)).fetchone()
        return json.loads(row["tracking"]) if row and row["tracking"] else None

    def pending_episodes(self) -> list[StoredEpisode]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {self._COLS} FROM episodes WHERE status='pending' ORDER BY seq").fetchall()
        return [self._episode(r) for r in rows]

    def samples_for(self, episode_ids: list[str], adapter: str | None = None) -> dict[str, list[EpisodeSample]]:
        """Each episode's samples, in order (``adapter``: only the samples that adapter generated)."""
        out: dict[str, list[EpisodeSample]] = {e: [] for e in episode_ids}
        only = "" if adapter is None else " AND adapter=?"
        with self._lock:
            for eid in episode_ids:
                rows = self._db.execute(
                    "SELECT agent, temperature, min_policy_version, input_ids, loss_mask, logprobs, call_indices, "
                    f"stats, weight, token_versions FROM samples WHERE episode_id=?{only} ORDER BY id",
                    (eid,) if adapter is None else (eid, adapter)).fetchall()
                out[eid] = [EpisodeSample(
                    input_ids=_ints(r["input_ids"]), loss_mask=_ints(r["loss_mask"]),
                    behaviour_logprobs=_floats(r["logprobs"]), agent=r["agent"], temperature=r["temperature"],
                    call_indices=json.loads(r["call_indices"]), min_policy_version=r["min_policy_version"],
                    stats=json.loads(r["stats"]), weight=r["weight"],
                    token_versions=_ints(r["token_versions"]) if r["token_versions"] is not None else None)
                    for r in rows]
        return out

    def episode_adapters(self, episode_id: str) -> list[str]:
        """The adapters an episode waits to be consumed by (a server with several adapters; else none)."""
        with self._lock:
            rows = self._db.execute("SELECT adapter FROM lane_episodes WHERE episode_id=? ORDER BY adapter",
                                    (episode_id,)).fetchall()
        return [r["adapter"] for r in rows]

    def count_by_status(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT status, COUNT(*) AS n FROM episodes GROUP BY status").fetchall()
        counts = {s.value: 0 for s in StoredStatus}
        counts.update({r["status"]: r["n"] for r in rows})
        return counts

    def eval_rewards(self) -> list[tuple[int, float | dict[str, float]]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT begin_policy_version, reward FROM episodes WHERE status='eval' ORDER BY seq").fetchall()
        return [(r["begin_policy_version"], json.loads(r["reward"])) for r in rows]

    def consumed_steps(self) -> dict[str, list[int]]:
        """episode id -> the steps that consumed it (for exactly-once audits: each list has length 1)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT episode_id, consumed_step FROM episodes WHERE consumed_step IS NOT NULL").fetchall()
        out: dict[str, list[int]] = {}
        for r in rows:
            out.setdefault(r["episode_id"], []).append(r["consumed_step"])
        return out

    def step_metrics(self) -> list[tuple[int, int, dict[str, float], float]]:
        with self._lock:
            rows = self._db.execute("SELECT step, policy_version, metrics, created_at FROM steps ORDER BY step").fetchall()
        return [(r["step"], r["policy_version"], json.loads(r["metrics"]), r["created_at"]) for r in rows]


class TrainingStore(Protocol):
    """What a training core reads and writes of the store: a ``SampleStore`` (one policy) or a ``LaneStore``
    (one adapter's view)."""

    def pending_episodes(self) -> list[StoredEpisode]: ...

    def samples_for(self, episode_ids: list[str]) -> dict[str, list[EpisodeSample]]: ...

    def mark_consumed(self, statuses: dict[str, StoredStatus], step: int | None,
                      step_record: tuple[int, dict[str, float]] | None = None) -> None: ...

    def rewind_to_step(self, step: int) -> int: ...


class LaneStore:
    """One adapter's view of the store, for its own training core (a server with several LoRA adapters): the
    episodes it has yet to consume, its samples, its steps. An episode whose calls used two adapters is consumed
    once by each (one ``lane_episodes`` row per (episode, adapter)); its own status leaves ``pending`` when the
    last of them has consumed it (``trained`` if any trained it), and a rewind of one adapter puts it back.
    It offers what the training core reads and writes of a ``SampleStore``, with the same meaning."""

    def __init__(self, store: SampleStore, adapter: str) -> None:
        self.store = store
        self.adapter = adapter

    @property
    def path(self) -> Path:
        return self.store.path

    def pending_episodes(self) -> list[StoredEpisode]:
        return self.store.episodes_where("JOIN lane_episodes l ON l.episode_id=e.episode_id WHERE l.adapter=? AND "
                                         "l.status='pending' AND e.status='pending' ORDER BY e.seq", (self.adapter,))

    def samples_for(self, episode_ids: list[str]) -> dict[str, list[EpisodeSample]]:
        return self.store.samples_for(episode_ids, adapter=self.adapter)

    def mark_consumed(self, statuses: dict[str, StoredStatus], step: int | None,
                      step_record: tuple[int, dict[str, float]] | None = None) -> None:
        """This adapter consumed ``statuses``' episodes at ``step``; an episode every adapter has consumed leaves
        ``pending`` in the same transaction."""
        with self.store.transaction() as cur:
            cur.executemany("UPDATE lane_episodes SET status=?, consumed_step=? WHERE episode_id=? AND "
                            "adapter=? AND status='pending'",
                            [(st.value, step, eid, self.adapter) for eid, st in statuses.items()])
            for eid, st in statuses.items():
                lanes = [r["status"] for r in cur.execute("SELECT status FROM lane_episodes WHERE episode_id=?",
                                                          (eid,))]
                if "pending" not in lanes:
                    final = StoredStatus.TRAINED.value if StoredStatus.TRAINED.value in lanes else st.value
                    cur.execute("UPDATE episodes SET status=?, consumed_step=? WHERE episode_id=? AND "
                                "status='pending'", (final, step, eid))
            if step_record is not None and step is not None:
                version, metrics = step_record
                cur.execute("INSERT OR REPLACE INTO lane_steps VALUES (?,?,?,?,?)",
                            (self.adapter, step, version, json.dumps(metrics), time.time()))

    def rewind_to_step(self, step: int) -> int:
        """Resume: what this adapter consumed after ``step`` is pending for it again (and so for the episode)."""
        consumed = (StoredStatus.TRAINED.value, StoredStatus.DROPPED_STALE.value, StoredStatus.DROPPED_UNIFORM.value)
        with self.store.transaction() as cur:
            rewound = cur.execute("UPDATE lane_episodes SET status='pending', consumed_step=NULL WHERE adapter=? AND "
                                  "consumed_step IS NOT NULL AND consumed_step > ?", (self.adapter, step)).rowcount
            cur.execute("UPDATE episodes SET status='pending', consumed_step=NULL WHERE status IN (?,?,?) AND "
                        "episode_id IN (SELECT episode_id FROM lane_episodes WHERE status='pending')", consumed)
            cur.execute("DELETE FROM lane_steps WHERE adapter=? AND step > ?", (self.adapter, step))
        return rewound

    def consumed_steps(self) -> dict[str, list[int]]:
        """episode id -> the steps of this adapter that consumed it (each list has length 1: exactly once)."""
        out: dict[str, list[int]] = {}
        for r in self.store.query("SELECT episode_id, consumed_step FROM lane_episodes WHERE adapter=? AND "
                                  "consumed_step IS NOT NULL", (self.adapter,)):
            out.setdefault(r["episode_id"], []).append(r["consumed_step"])
        return out

    def step_metrics(self) -> list[tuple[int, int, dict[str, float], float]]:
        rows = self.store.query("SELECT step, policy_version, metrics, created_at FROM lane_steps WHERE adapter=? "
                                "ORDER BY step", (self.adapter,))
        return [(r["step"], r["policy_version"], json.loads(r["metrics"]), r["created_at"]) for r in rows]

    def episode_adapters(self, episode_id: str) -> list[str]:
        return self.store.episode_adapters(episode_id)


EPISODE_SUMMARY_COLS = ("episode_id", "client_id", "task_id", "task_type", "status", "reward", "begin_policy_version",
                        "min_policy_version", "consumed_step", "n_calls", "n_samples", "ended_at", "team_id",
                        "commit_status")
_FILTER_COLS = frozenset({"task_type", "client_id", "begin_policy_version"})


class StoreReader:
    """The read side's queries on the store, on a read-only connection of its own (``query_only``), so dashboard
    polls never wait on the store lock that the request path and the trainer hold. Rows come back by name."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA query_only=1")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def count_by_status(self) -> dict[str, int]:
        return {r["status"]: r["n"] for r in self._query("SELECT status, COUNT(*) AS n FROM episodes GROUP BY status")}

    def steps(self, after: int, limit: int, adapter: str | None = None) -> list[dict[str, Any]]:
        """``{step, policy_version, metrics, created_at}`` of the steps after ``after``, oldest first: the one
        policy's, or one LoRA adapter's (a server with several keeps each adapter's steps apart)."""
        if adapter is None:
            rows = self._query("SELECT step, policy_version, metrics, created_at FROM steps WHERE step > ? "
                               "ORDER BY step LIMIT ?", (after, limit))
        else:
            rows = self._query("SELECT step, policy_version, metrics, created_at FROM lane_steps WHERE adapter=? AND "
                               "step > ? ORDER BY step LIMIT ?", (adapter, after, limit))
        return [{**dict(r), "metrics": json.loads(r["metrics"])} for r in rows]

    def eval_rewards(self) -> list[tuple[int, str, float | dict[str, float]]]:
        """(policy version at begin, task type, reward) of every eval episode, oldest first."""
        rows = self._query("SELECT begin_policy_version, task_type, reward FROM episodes WHERE status='eval' "
                           "ORDER BY seq")
        return [(r["begin_policy_version"], r["task_type"], json.loads(r["reward"])) for r in rows]

    def counts_by_client(self) -> dict[str, dict[str, int]]:
        """Stored episodes per client and status."""
        out: dict[str, dict[str, int]] = {}
        for r in self._query("SELECT client_id, status, COUNT(*) AS n FROM episodes GROUP BY client_id, status"):
            out.setdefault(r["client_id"], {})[r["status"]] = r["n"]
        return out

    def episodes(self, statuses: tuple[str, ...] | None, equals: dict[str, Any], eval: bool | None,
                 limit: int) -> list[dict[str, Any]]:
        """The newest stored episodes (``EPISODE_SUMMARY_COLS``, reward decoded) with one of ``statuses``, the
        column values in ``equals`` (task_type, client_id, begin_policy_version) and, if given, eval or not."""
        where: list[str] = []
        args: list[Any] = []
        if statuses is not None:
            where.append(f"status IN ({','.join('?' * len(statuses))})")
            args += statuses
        for col, value in equals.items():
            if col not in _FILTER_COLS:
                raise ValueError(f"cannot filter episodes by {col!r}")
            where.append(f"{col} = ?")
            args.append(value)
        if eval is not None:
            where.append("(status = 'eval' OR commit_status = 'eval')" if eval
                         else "NOT (status = 'eval' OR IFNULL(commit_status, '') = 'eval')")
        sql = f"SELECT {', '.join(EPISODE_SUMMARY_COLS)} FROM episodes"
        sql += (f" WHERE {' AND '.join(where)}" if where else "") + " ORDER BY seq DESC LIMIT ?"
        return [{**dict(r), "reward": json.loads(r["reward"])} for r in self._query(sql, (*args, limit))]

    def team_episodes(self, team_id: str) -> list[str]:
        return [r["episode_id"] for r in self._query("SELECT episode_id FROM episodes WHERE team_id=? ORDER BY seq",
                                                     (team_id,))]

