"""The SQLite files a server writes (the sample store, the train log): one way to open them."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Literal


def open_wal_db(path: Path, schema: str, synchronous: Literal["FULL", "NORMAL"]) -> sqlite3.Connection:
    """A WAL-mode connection in autocommit mode, usable from any thread (callers hold their own lock), with
    ``schema`` applied. ``synchronous``: FULL where a commit must survive a power cut (acknowledged episodes),
    NORMAL where losing the last write on a crash is fine (diagnostic logs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.executescript(schema)
    return db
