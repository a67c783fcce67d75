"""The SQLite backend of ``StoreReader``: the read side's queries (the status, the dashboard, ``/metrics``,
``ajet export``) on a read-only connection of its own (``query_only``), so dashboard polls never wait on the
lock that the request path and the trainer hold. It never writes, and never migrates an old data dir."""

from __future__ import annotations

import json
from pathlib import Path
from sqlite3 import Row
from typing import Any

from agentjet.server.store.connection import Connection
from agentjet.server.store.records import EvalReward, StepRecord
from agentjet.server.store.rows import by_status, step_of

EPISODE_SUMMARY_COLS = ("episode_id", "client_id", "task_id", "task_type", "status", "reward", "begin_policy_version",
                        "min_policy_version", "consumed_step", "n_calls", "n_samples", "ended_at", "team_id",
                        "commit_status")
_FILTER_COLS = frozenset({"task_type", "client_id", "begin_policy_version"})


class SQLiteReader:
    def __init__(self, path: Path) -> None:
        self._conn = Connection.read_only(path)

    def close(self) -> None:
        self._conn.close()

    def count_by_status(self) -> dict[str, int]:
        with self._conn.reading() as db:
            return by_status(db.execute("SELECT status, COUNT(*) AS n FROM episodes GROUP BY status").fetchall())

    def counts_by_client(self) -> dict[str, dict[str, int]]:
        with self._conn.reading() as db:
            rows = db.execute("SELECT client_id, status, COUNT(*) AS n FROM episodes GROUP BY client_id, status"
                              ).fetchall()
        per_client: dict[str, list[Row]] = {}
        for r in rows:
            per_client.setdefault(r["client_id"], []).append(r)
        return {client: by_status(own) for client, own in per_client.items()}

    def steps(self, after: int, limit: int, adapter: str | None = None) -> list[StepRecord]:
        with self._conn.reading() as db:
            if adapter is None:
                rows = db.execute("SELECT step, policy_version, metrics, created_at FROM steps WHERE step > ? "
                                  "ORDER BY step LIMIT ?", (after, limit)).fetchall()
            else:
                rows = db.execute("SELECT step, policy_version, metrics, created_at FROM lane_steps WHERE adapter=? "
                                  "AND step > ? ORDER BY step LIMIT ?", (adapter, after, limit)).fetchall()
        return [step_of(r) for r in rows]

    def eval_rewards(self) -> list[EvalReward]:
        with self._conn.reading() as db:
            rows = db.execute("SELECT begin_policy_version, task_type, reward, json_extract(metadata, '$.level') AS "
                              "level FROM episodes WHERE status='eval' ORDER BY seq").fetchall()
        return [EvalReward(r["begin_policy_version"], r["task_type"], json.loads(r["reward"]),
                           r["level"] if isinstance(r["level"], int) else None) for r in rows]

    def episodes(self, statuses: tuple[str, ...] | None, equals: dict[str, Any], eval: bool | None,
                 limit: int) -> list[dict[str, Any]]:
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
        with self._conn.reading() as db:
            rows = db.execute(sql, (*args, limit)).fetchall()
        return [{**dict(r), "reward": json.loads(r["reward"])} for r in rows]

    def team_episodes(self, team_id: str) -> list[str]:
        with self._conn.reading() as db:
            rows = db.execute("SELECT episode_id FROM episodes WHERE team_id=? ORDER BY seq", (team_id,)).fetchall()
        return [r["episode_id"] for r in rows]
