"""One SQLite connection and the lock that every use of it holds. The writer (``sqlite.SQLiteStore``) and its
adapters' lanes (``lanes.SQLiteLane``) share one; the read side (``reader.SQLiteReader``) has its own, read-only.
Only the store's own classes use it: nothing outside ``agentjet.server.store`` sees a connection or a cursor."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path


class Connection:
    def __init__(self, db: sqlite3.Connection) -> None:
        db.row_factory = sqlite3.Row  # every row is read by column name
        self.db = db
        self.lock = threading.Lock()

    @classmethod
    def read_only(cls, path: Path) -> Connection:
        """A connection that cannot write (``query_only``) and never changes the file's schema."""
        db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA query_only=1")
        return cls(db)

    @contextlib.contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """The connection, under the lock (autocommit: each statement reads the last committed state)."""
        with self.lock:
            yield self.db

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction under the lock: ``BEGIN IMMEDIATE``, then ``COMMIT``, or ``ROLLBACK`` on any error
        (unless SQLite has already rolled it back)."""
        with self.lock:
            cur = self.db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    cur.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self.lock:
            self.db.close()
