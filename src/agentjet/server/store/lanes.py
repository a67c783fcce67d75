"""One LoRA adapter's lane of the SQLite store (``SampleStore.lane``), for its own training core on a server with
several adapters: the episodes it has yet to consume, its samples, its steps. An episode whose calls used two
adapters is consumed once by each (one ``lane_episodes`` row per (episode, adapter)); its own status leaves
``pending`` when the last of them has consumed it (``trained`` if any trained it), and a rewind of one adapter
puts it back. It shares the store's connection and lock."""

from __future__ import annotations

import json
import time

from agentjet.server.store.connection import Connection
from agentjet.server.store.records import CONSUMED, StepRecord, StoredEpisode, StoredStatus
from agentjet.server.store.rows import consumed_of, episode_columns, episode_of, read_samples, step_of
from agentjet.tracking import EpisodeSample


class SQLiteLane:
    """``TrainingStore`` for one adapter, with the same meaning as the whole store's."""

    def __init__(self, conn: Connection, adapter: str) -> None:
        self._conn = conn
        self.adapter = adapter

    def pending_episodes(self) -> list[StoredEpisode]:
        with self._conn.reading() as db:
            rows = db.execute(f"SELECT {episode_columns('e')} FROM episodes e JOIN lane_episodes l "
                              "ON l.episode_id=e.episode_id WHERE l.adapter=? AND l.status='pending' AND "
                              "e.status='pending' ORDER BY e.seq", (self.adapter,)).fetchall()
        return [episode_of(r) for r in rows]

    def samples_for(self, episode_ids: list[str]) -> dict[str, list[EpisodeSample]]:
        """Only the samples this adapter generated."""
        with self._conn.reading() as db:
            return read_samples(db, episode_ids, adapter=self.adapter)

    def mark_consumed(self, statuses: dict[str, StoredStatus], step: int | None,
                      step_record: tuple[int, dict[str, float]] | None = None) -> None:
        """This adapter consumed ``statuses``' episodes at ``step``; an episode every adapter has consumed leaves
        ``pending`` in the same transaction."""
        with self._conn.transaction() as cur:
            cur.executemany("UPDATE lane_episodes SET status=?, consumed_step=? WHERE episode_id=? AND "
                            "adapter=? AND status='pending'",
                            [(st.value, step, eid, self.adapter) for eid, st in statuses.items()])
            for eid, st in statuses.items():
                lanes = [r["status"] for r in cur.execute("SELECT status FROM lane_episodes WHERE episode_id=?",
                                                          (eid,))]
                if StoredStatus.PENDING.value not in lanes:
                    final = StoredStatus.TRAINED.value if StoredStatus.TRAINED.value in lanes else st.value
                    cur.execute("UPDATE episodes SET status=?, consumed_step=? WHERE episode_id=? AND "
                                "status='pending'", (final, step, eid))
            if step_record is not None and step is not None:
                version, metrics = step_record
                cur.execute("INSERT OR REPLACE INTO lane_steps VALUES (?,?,?,?,?)",
                            (self.adapter, step, version, json.dumps(metrics), time.time()))

    def rewind_to_step(self, step: int) -> int:
        """What this adapter consumed after ``step`` is pending for it again (and so for the episode)."""
        with self._conn.transaction() as cur:
            rewound = cur.execute("UPDATE lane_episodes SET status='pending', consumed_step=NULL WHERE adapter=? AND "
                                  "consumed_step IS NOT NULL AND consumed_step > ?", (self.adapter, step)).rowcount
            cur.execute("UPDATE episodes SET status='pending', consumed_step=NULL WHERE status IN (?,?,?) AND "
                        "episode_id IN (SELECT episode_id FROM lane_episodes WHERE status='pending')",
                        tuple(s.value for s in CONSUMED))
            cur.execute("DELETE FROM lane_steps WHERE adapter=? AND step > ?", (self.adapter, step))
        return rewound

    def consumed_steps(self) -> dict[str, list[int]]:
        """episode id -> the steps of this adapter that consumed it (each list has length 1: exactly once)."""
        with self._conn.reading() as db:
            return consumed_of(db.execute("SELECT episode_id, consumed_step FROM lane_episodes WHERE adapter=? AND "
                                          "consumed_step IS NOT NULL", (self.adapter,)).fetchall())

    def step_metrics(self) -> list[StepRecord]:
        with self._conn.reading() as db:
            rows = db.execute("SELECT step, policy_version, metrics, created_at FROM lane_steps WHERE adapter=? "
                              "ORDER BY step", (self.adapter,)).fetchall()
        return [step_of(r) for r in rows]
