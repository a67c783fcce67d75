"""The store's tables, and the one migration: a data dir written by an earlier version gets the newer columns
when the writer opens it (``open_store``). The read side never migrates (``Connection.read_only``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agentjet.runtime.storage import open_wal_db
from agentjet.server.store.connection import Connection

SCHEMA = """
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


def open_store(path: Path) -> Connection:
    """The writer's connection: WAL, ``synchronous=FULL`` (an acknowledged episode survives a crash), the tables
    created and any missing columns added."""
    db = open_wal_db(path, SCHEMA, synchronous="FULL")
    db.row_factory = sqlite3.Row
    add_missing_columns(db)
    return Connection(db)


def add_missing_columns(db: sqlite3.Connection) -> None:
    """A data dir written by an earlier version lacks the newer columns (CREATE TABLE IF NOT EXISTS keeps the
    old table): add them, so --resume after an upgrade does not fail every end and every train step."""
    want = sqlite3.connect(":memory:")
    want.row_factory = sqlite3.Row
    try:
        want.executescript(SCHEMA)
        tables = [r["name"] for r in want.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                                  "AND name NOT LIKE 'sqlite_%'")]
        for table in tables:
            have = {r["name"] for r in db.execute(f"PRAGMA table_info({table})")}
            for col in want.execute(f"PRAGMA table_info({table})"):
                if col["name"] not in have:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {col['name']} {col['type']}"
                               + (" NOT NULL" if col["notnull"] else "")
                               + (f" DEFAULT {col['dflt_value']}" if col["dflt_value"] is not None else ""))
    finally:
        want.close()
