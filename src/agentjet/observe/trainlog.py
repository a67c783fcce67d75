"""The trainer's per-sample view for the trace viewer: advantage and trainer logprobs of each trained sample.

A small SQLite file of its own (``observe.sqlite`` in the data dir), written once per train step from a worker
thread and read by the dashboard: the sample store's lock and schema stay untouched. Keyed by (episode, sample):
after a ``--resume`` a sample trained again replaces its row.
"""

from __future__ import annotations

import threading
from array import array
from pathlib import Path
from typing import Any

from agentjet.observe.events import TrainedSample
from agentjet.runtime.storage import open_wal_db

_SCHEMA = """
CREATE TABLE IF NOT EXISTS trained_samples (
  episode_id TEXT NOT NULL,
  sample_index INTEGER NOT NULL,
  step INTEGER NOT NULL,
  policy_version INTEGER NOT NULL,
  agent TEXT NOT NULL,
  advantage REAL NOT NULL,
  trainer_logprobs BLOB,
  PRIMARY KEY (episode_id, sample_index)
);
"""


class TrainLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = open_wal_db(path, _SCHEMA, synchronous="NORMAL")  # a diagnostic log: losing a step is fine

    def record(self, step: int, policy_version: int, samples: list[TrainedSample]) -> None:
        rows = [(s.episode_id, s.sample_index, step, policy_version, s.agent, s.advantage,
                 array("d", s.trainer_logprobs).tobytes() if s.trainer_logprobs is not None else None)
                for s in samples]
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO trained_samples VALUES (?,?,?,?,?,?,?)", rows)
            self._db.execute("COMMIT")

    def for_episode(self, episode_id: str) -> dict[int, dict[str, Any]]:
        """sample index -> {step, policy_version, agent, advantage, trainer_logprobs (per trained token)}."""
        with self._lock:
            rows = self._db.execute(
                "SELECT sample_index, step, policy_version, agent, advantage, trainer_logprobs FROM trained_samples "
                "WHERE episode_id=?", (episode_id,)).fetchall()
        out: dict[int, dict[str, Any]] = {}
        for idx, step, version, agent, adv, blob in rows:
            lps = None
            if blob is not None:
                a = array("d")
                a.frombytes(blob)
                lps = a.tolist()
            out[idx] = {"step": step, "policy_version": version, "agent": agent, "advantage": adv,
                        "trainer_logprobs": lps}
        return out

    def close(self) -> None:
        with self._lock:
            self._db.close()
