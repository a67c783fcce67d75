"""The store's interface: named operations and no SQL outside ``agentjet.server.store``; each read defined once
(the stored counts and the eval rewards agree wherever they are read); ``ajet export`` reads without writing."""

from __future__ import annotations

import ast
import inspect
import re
import sqlite3
import time
from pathlib import Path

import pytest

import agentjet
from agentjet.apps.export import eval_reward_at
from agentjet.server import store as store_pkg
from agentjet.server.store import (
    EvalReward,
    SampleStore,
    SQLiteReader,
    SQLiteStore,
    StoredEpisode,
    StoredStatus,
    StoreReader,
)
from agentjet.tracking import EpisodeSample

SRC = Path(agentjet.__file__).parent
STORE = Path(store_pkg.__file__).parent
# The other SQLite files' own modules: the one opener of a SQLite file (it applies its caller's schema), and the
# train log (a database of its own, the trained samples' advantages and logprobs).
OTHER_STORES = frozenset({SRC / "runtime" / "storage.py", SRC / "observe" / "trainlog.py"})
SQL = re.compile(r"\b(SELECT\s.+\sFROM|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|CREATE\s+(TABLE|INDEX)"
                 r"|ALTER\s+TABLE|PRAGMA\s+\w+|BEGIN\s+IMMEDIATE)\b", re.S)
EXECUTE = {"execute", "executemany", "executescript"}


def _sources(exclude: frozenset[Path] = frozenset()) -> list[tuple[Path, ast.Module]]:
    return [(f, ast.parse(f.read_text())) for f in sorted(SRC.rglob("*.py"))
            if f not in exclude and STORE not in f.parents]


def _strings(tree: ast.AST) -> list[str]:
    """Every string literal, an f-string's parts joined (``{}`` where a value goes)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
    return out


def test_no_sql_and_no_sqlite3_outside_the_store() -> None:
    sql = [(f.relative_to(SRC), s[:60]) for f, tree in _sources(OTHER_STORES) for s in _strings(tree) if SQL.search(s)]
    assert sql == []
    imports = [f.relative_to(SRC) for f, tree in _sources(OTHER_STORES) for node in ast.walk(tree)
               if isinstance(node, ast.Import | ast.ImportFrom)
               and any(m.split(".")[0] == "sqlite3" for m in ([a.name for a in node.names]
                                                            if isinstance(node, ast.Import) else [node.module or ""]))]
    assert imports == []


def test_the_scan_finds_the_sql_it_looks_for() -> None:  # the scan above can fail
    planted = ast.parse('q = f"SELECT {c} FROM episodes e JOIN lane_episodes l ON l.x = e.x"\n'
                        'db.execute("UPDATE episodes SET status=? WHERE episode_id=?")\n'
                        'x = "DELETE"  # an HTTP verb, not SQL\n')
    assert [s for s in _strings(planted) if SQL.search(s)] == [
        "SELECT {} FROM episodes e JOIN lane_episodes l ON l.x = e.x", "UPDATE episodes SET status=? WHERE episode_id=?"]


def _takes_sql(tree: ast.Module) -> list[str]:
    """Functions through which a caller's text reaches ``execute``: one of its parameters is (part of) the
    statement, directly or through another such function."""
    funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    sinks, found = set(EXECUTE), []
    changed = True
    while changed:
        changed = False
        for fn in funcs:
            params = {a.arg for a in fn.args.args + fn.args.kwonlyargs} - {"self", "cls"}
            if fn.name in found:
                continue
            for call in ast.walk(fn):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute | ast.Name) and call.args
                        and (call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id) in sinks
                        and {n.id for n in ast.walk(call.args[0]) if isinstance(n, ast.Name)} & params):
                    found.append(fn.name)
                    sinks.add(fn.name)
                    changed = True
                    break
    return found


def test_no_function_takes_sql() -> None:
    """Nothing offers a door for SQL: not the store's operations, not a helper of theirs, nothing else. (The one
    opener of a SQLite file applies the schema its caller declares, ``runtime/storage.open_wal_db``.)"""
    found = {f"{f.relative_to(SRC)}:{name}" for f in sorted(SRC.rglob("*.py")) for name in
             _takes_sql(ast.parse(f.read_text()))}
    assert found == {"runtime/storage.py:open_wal_db"}
    old = ast.parse("class S:\n    def query(self, sql, args=()):\n        return self._db.execute(sql, args)\n"
                    "    def episodes_where(self, sql):\n        return self.query(f'SELECT * FROM episodes e {sql}')\n")
    assert _takes_sql(old) == ["query", "episodes_where"]  # what the store offered before


def _operations(cls: type) -> set[str]:
    return {n for n, v in inspect.getmembers(cls) if not n.startswith("_") and callable(v)}


def test_each_read_is_defined_once() -> None:
    """The writer and the read side share no operation but ``close``: a count or a reward read in two places is
    two definitions that can disagree (they did: one count filled zeros, one eval read had no task type)."""
    assert _operations(SampleStore) & _operations(StoreReader) == {"close"}
    assert _operations(SQLiteStore) & _operations(SQLiteReader) == {"close"}
    assert _operations(SampleStore) <= _operations(SQLiteStore)
    assert _operations(StoreReader) <= _operations(SQLiteReader)


def episode(eid: str, status: StoredStatus, client: str = "c", version: int = 0, reward: float = 1.0,
            task_type: str = "math") -> StoredEpisode:
    return StoredEpisode(eid, "h", client, "t", task_type, "g", reward, status, 1, 1, version, version, time.time())


def sample() -> EpisodeSample:
    return EpisodeSample(input_ids=[1, 2, 3], loss_mask=[0, 1, 1], behaviour_logprobs=[0.0, -0.1, -0.2],
                         agent="default", temperature=1.0, call_indices=[0], min_policy_version=0)


def test_the_stored_counts_name_every_status(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.sqlite")
    reader = SQLiteReader(store.path)
    zero = {s.value: 0 for s in StoredStatus}
    assert reader.count_by_status() == zero and reader.counts_by_client() == {}  # an empty store
    for eid, status, client in [("a", StoredStatus.PENDING, "c1"), ("b", StoredStatus.PENDING, "c1"),
                                ("c", StoredStatus.EVAL, "c2"), ("d", StoredStatus.PREPARED, "c2")]:
        assert store.commit_episode(episode(eid, status, client), [sample()], {})
    store.mark_consumed({"a": StoredStatus.TRAINED}, step=1, step_record=(1, {"loss": 0.5}))
    assert reader.count_by_status() == {**zero, "pending": 1, "trained": 1, "eval": 1, "prepared": 1}
    assert reader.counts_by_client() == {"c1": {**zero, "pending": 1, "trained": 1},
                                         "c2": {**zero, "eval": 1, "prepared": 1}}
    steps = reader.steps(after=0, limit=10)
    assert [(s.step, s.policy_version, s.metrics) for s in steps] == [(1, 1, {"loss": 0.5})]
    assert steps == store.step_metrics()  # one record of a step, read on either connection
    reader.close()
    store.close()


def test_eval_rewards_carry_their_version_and_task_type_and_export_reads_them_without_writing(
        tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    store = SQLiteStore(path)
    store.commit_episode(episode("e1", StoredStatus.EVAL, version=2, reward=1.0, task_type="math"), [], {})
    store.commit_episode(episode("e2", StoredStatus.EVAL, version=2, reward=0.0, task_type="code"), [], {})
    store.commit_episode(episode("e3", StoredStatus.EVAL, version=3, reward=0.5), [], {})
    store.commit_episode(episode("t1", StoredStatus.PENDING, version=2, reward=9.0), [], {})
    store.close()
    reader = SQLiteReader(path)
    assert reader.eval_rewards() == [EvalReward(2, "math", 1.0), EvalReward(2, "code", 0.0), EvalReward(3, "math", 0.5)]
    with pytest.raises(sqlite3.OperationalError, match="readonly"):  # the read side cannot write
        reader._conn.db.execute("DELETE FROM episodes")
    reader.close()

    # A data dir from an earlier version, missing a newer column: export reads it, and neither migrates nor
    # writes it (the writable store would add the column back).
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE episodes DROP COLUMN max_policy_version")
    db.commit()
    db.close()
    before = path.read_bytes()
    result = eval_reward_at(tmp_path, 2)
    assert (result.mean, result.episodes) == (0.5, 2)
    assert eval_reward_at(tmp_path, 7).episodes == 0
    assert path.read_bytes() == before
    db = sqlite3.connect(path)
    assert "max_policy_version" not in {r[1] for r in db.execute("PRAGMA table_info(episodes)")}
    db.close()
