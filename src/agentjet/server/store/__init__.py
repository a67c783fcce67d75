"""The server's durable store: named operations behind an interface, and no SQL outside this package.

- ``api``: the interface. ``SampleStore`` (the durable store: episodes, team decisions, train steps),
  ``TrainingStore`` (what one training core reads and writes), ``StoreReader`` (the read side).
- ``records``: what it holds (``StoredEpisode``, ``StoredStatus``, ``TraceRow``, ``StepRecord``, ``EvalReward``),
  and ``StoreError``.
- ``sqlite.SQLiteStore``: the SQLite backend of ``SampleStore``; ``lanes.SQLiteLane``: one LoRA adapter's lane of
  it (``SQLiteStore.lane``); ``reader.SQLiteReader``: the SQLite backend of ``StoreReader``, on a read-only
  connection of its own.
- ``schema``: the tables and the one migration; ``rows``: rows to records and back; ``connection``: one
  connection under one lock (reads, write transactions).

The server is written against the protocols; ``swarm.py`` builds the SQLite backend.
"""

from agentjet.server.store.api import SampleStore, StoreReader, TrainingStore
from agentjet.server.store.reader import SQLiteReader
from agentjet.server.store.records import (
    EvalReward,
    StepRecord,
    StoredEpisode,
    StoredStatus,
    StoreError,
    TraceRow,
)
from agentjet.server.store.sqlite import SQLiteStore

__all__ = [
    "EvalReward",
    "SQLiteReader",
    "SQLiteStore",
    "SampleStore",
    "StepRecord",
    "StoreError",
    "StoreReader",
    "StoredEpisode",
    "StoredStatus",
    "TraceRow",
    "TrainingStore",
]
