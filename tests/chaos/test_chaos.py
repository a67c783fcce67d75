"""Chaos: client and server SIGKILLs against the exactly-once invariant (see ``harness.py``).

The default run (200 acknowledged episodes, 6 client processes, 30% of them SIGKILLed, one server SIGKILL
and ``--resume``) takes about a minute on 2 CPU cores. Size it with ``AGENTJET_CHAOS_EPISODES``,
``_CLIENTS``, ``_KILL_FRACTION``, ``_SERVER_KILLS`` and ``_SEED``; ``benchmarks/reliability/chaos.py`` runs it longer.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from tests.chaos.harness import config_from_env, run_chaos

from agentjet import SwarmClient

USER = [{"role": "user", "content": "what is 2 + 2?"}]


@pytest.mark.timeout(900)
@pytest.mark.server
def test_chaos_acknowledged_episodes_are_trained_once_or_still_stored(tmp_path: Path, tiny_model_path: Path) -> None:
    cfg = config_from_env(timeout_s=800.0)
    report = run_chaos(cfg, tmp_path / "chaos", say=lambda msg: print(msg, flush=True))
    print(report.table())
    (tmp_path / "chaos" / "report.json").write_text(json.dumps(report.as_dict(), indent=2, default=str))
    assert report.problems() == [], report.table()
    assert report.lost == 0 and report.duplicates_in_logs == 0
    assert report.acked == report.trained + report.pending + report.dropped
    assert report.client_kills == report.planned_client_kills
    assert len(report.server_kills) == cfg.server_kills
    for kill in report.server_kills:
        assert kill.steps_after_restart >= kill.checkpoint_step  # resumed from the checkpoint, not from zero
        assert report.final_step > kill.steps_before  # and training went on after the restart


def test_slow_end_is_not_expired_under_it(make_server) -> None:
    """Regression (found by the chaos run's calls audit): an end that took longer than the rest of the lease
    was acknowledged while the reaper expired the episode and cleared its calls, storing it with no samples."""
    import openai  # noqa: F401 - imported up front: a first import inside the episode blocks its heartbeat

    srv = make_server(lease_seconds=1.0)
    real = srv.server.ingest.build_samples

    def slow_build(calls):  # noqa: ANN001, ANN202
        time.sleep(2.0)  # > the lease: the reaper runs meanwhile
        return real(calls)

    srv.server.ingest.build_samples = slow_build

    async def main():  # noqa: ANN202
        async with SwarmClient(srv.url) as client:
            async with client.episode(task_id="t") as ep:
                for _ in range(2):
                    await ep.openai().chat.completions.create(model="tiny", messages=USER)
                ep.reward(1.0)
            return ep.result

    result = asyncio.run(main())
    assert result is not None and result.acknowledged and result.calls == 2
    (stored,) = srv.server.store.pending_episodes()
    assert stored.n_calls == 2 and stored.n_samples >= 1
    assert srv.server.registry.counts["expired"] == 0


OLD_SCHEMA = """
CREATE TABLE episodes (seq INTEGER PRIMARY KEY AUTOINCREMENT, episode_id TEXT UNIQUE NOT NULL,
  key_hash TEXT NOT NULL, client_id TEXT NOT NULL, task_id TEXT NOT NULL, task_type TEXT NOT NULL,
  group_key TEXT NOT NULL, reward TEXT NOT NULL, metadata TEXT NOT NULL, status TEXT NOT NULL,
  n_calls INTEGER NOT NULL, n_samples INTEGER NOT NULL, begin_policy_version INTEGER NOT NULL,
  min_policy_version INTEGER NOT NULL, ended_at REAL NOT NULL, consumed_step INTEGER);
CREATE TABLE samples (id INTEGER PRIMARY KEY AUTOINCREMENT, episode_id TEXT NOT NULL, agent TEXT NOT NULL,
  temperature REAL NOT NULL, min_policy_version INTEGER NOT NULL, input_ids BLOB NOT NULL,
  loss_mask BLOB NOT NULL, logprobs BLOB NOT NULL, call_indices TEXT NOT NULL, stats TEXT NOT NULL);
CREATE TABLE steps (step INTEGER PRIMARY KEY, policy_version INTEGER NOT NULL, metrics TEXT NOT NULL,
  created_at REAL NOT NULL);
"""


def test_resume_on_a_store_written_by_an_earlier_version(tmp_path: Path) -> None:
    """Regression (found by a chaos run that restarted the server across a schema change): the restarted
    server kept the old tables, so every end answered 503 ('no column named tracking') and every train step
    failed ('no such column: weight'). Missing columns are now added when the store opens."""
    import sqlite3
    from array import array

    from agentjet.server.store import SQLiteStore, StoredEpisode, StoredStatus
    from agentjet.tracking import EpisodeSample

    path = tmp_path / "store.sqlite"
    old = sqlite3.connect(path)
    old.executescript(OLD_SCHEMA)
    old.execute("INSERT INTO episodes (episode_id, key_hash, client_id, task_id, task_type, group_key, reward, "
                "metadata, status, n_calls, n_samples, begin_policy_version, min_policy_version, ended_at) "
                "VALUES ('old', 'h', 'c', 't', 'd', 't', '1.0', '{}', 'pending', 1, 1, 0, 0, 0)")
    old.execute("INSERT INTO samples (episode_id, agent, temperature, min_policy_version, input_ids, loss_mask, "
                "logprobs, call_indices, stats) VALUES ('old', 'default', 1.0, 0, ?, ?, ?, '[0]', '{}')",
                (array("q", [1, 2]).tobytes(), array("q", [0, 1]).tobytes(), array("d", [0.0, -0.5]).tobytes()))
    old.commit()
    old.close()

    store = SQLiteStore(path)
    sample = EpisodeSample(input_ids=[1, 2, 3], loss_mask=[0, 1, 1], behaviour_logprobs=[0.0, -0.1, -0.2],
                           agent="default", temperature=1.0, call_indices=[0], min_policy_version=0)
    assert store.commit_episode(StoredEpisode("new", "h", "c", "t", "d", "t", 0.0, StoredStatus.PENDING, 1, 1, 0, 0,
                                              time.time()), [sample], {})
    assert [e.episode_id for e in store.pending_episodes()] == ["old", "new"]
    got = store.samples_for(["old", "new"])
    assert got["old"][0].input_ids == [1, 2] and got["old"][0].weight == 1.0
    assert got["new"][0].loss_mask == [0, 1, 1]
    store.close()
