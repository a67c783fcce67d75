"""The server's one read model: every counter written at one site (``server/counters.py``), a checkpoint's
counters restored through one method, and one snapshot (``run_state.snapshot``) behind the status, the
dashboard's run view and the Prometheus metrics."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import httpx
import pytest
from tests.conftest import settle, wait_until
from tests.observe.helpers import ADMIN, READ, play_group

import agentjet
from agentjet.observe import ObserveSettings
from agentjet.protocol import ServerStatus
from agentjet.runtime.clock import FakeClock
from agentjet.server import counters as counters_module
from agentjet.server.counters import (
    CHECKPOINTED,
    AdmissionCounters,
    RequestCounters,
    TaskLevels,
    TitoCounters,
    TrackingTotals,
    TrainingCounters,
)
from agentjet.server.store import SQLiteStore
from agentjet.server.training.checkpoints import Checkpoints
from agentjet.settings import ServerConfig
from agentjet.weights.checkpoints import SERVER_STATE

SRC = Path(agentjet.__file__).parent
COUNTERS = (RequestCounters, TitoCounters, TrackingTotals, AdmissionCounters, TrainingCounters, TaskLevels)
# Attributes that share a counter's name but are no counter: (module, the written expression).
NOT_COUNTERS = {("server/swarm.py", "self.episodes")}


def _written(tree: ast.AST) -> list[ast.expr]:
    """Every attribute an assignment writes (``a.b = ``, ``a.b += ``, ``a.b[k] = ``)."""
    out: list[ast.expr] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for t in targets:
            subscripted = isinstance(t, ast.Subscript)
            while isinstance(t, ast.Subscript):
                t = t.value
            if subscripted and isinstance(t, ast.Attribute):  # ``a.b[k] =``: ``a.b`` is read (Load), then written
                out.append(t)
            out.extend(e for e in ast.walk(t) if isinstance(e, ast.Attribute) and isinstance(e.ctx, ast.Store))
    return out


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} - {"started"}


def test_no_counter_is_written_outside_its_read_model() -> None:
    names = set().union(*(_fields(c) for c in COUNTERS))
    found = []
    for path in sorted([*SRC.glob("server/**/*.py"), *SRC.glob("observe/**/*.py")]):
        rel = path.relative_to(SRC).as_posix()
        if rel == "server/counters.py":
            continue
        for attr in _written(ast.parse(path.read_text())):
            if attr.attr in names and (rel, ast.unparse(attr)) not in NOT_COUNTERS:
                found.append(f"{rel}:{attr.lineno}: {ast.unparse(attr)}")
    assert found == [], "counters are written only by their methods in server/counters.py"


def _class_writers(path: Path, cls: type) -> tuple[ast.ClassDef, dict[str, list[str]]]:
    """``cls``'s definition in ``path``, and for each ``self.<attr>`` its methods that write it."""
    (node,) = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    writers: dict[str, list[str]] = {}
    for fn in node.body:
        if isinstance(fn, ast.FunctionDef):
            for attr in _written(fn):
                if isinstance(attr.value, ast.Name) and attr.value.id == "self":
                    writers.setdefault(attr.attr, []).append(fn.name)
    return node, writers


@pytest.mark.parametrize("cls", COUNTERS, ids=lambda c: c.__name__)
def test_each_counter_has_one_write_site(cls: type) -> None:
    """Inside its class, each counter is written by exactly one method (``restore`` sets the checkpointed ones
    by name, in one loop: it is the one restore, not a second write per field)."""
    node, writers = _class_writers(Path(counters_module.__file__), cls)
    for name in _fields(cls):
        sites = writers.get(name, [])
        if cls is TrainingCounters and name == "by_type":
            continue  # a dict of TypeTotals: written through trained_type (checked below)
        assert len(sites) == 1, f"{cls.__name__}.{name} is written in {sites}"
    if cls is TrainingCounters:
        restore = next(fn for fn in node.body if isinstance(fn, ast.FunctionDef) and fn.name == "restore")
        assert "setattr" in ast.unparse(restore)


class _Versioned:
    """An engine stand-in for checkpoints: a policy version saved and loaded."""

    policy_version = 0

    def save(self, path: Path) -> None:
        assert path.is_dir() and not any(path.iterdir())  # an empty directory to fill
        (path / "v.json").write_text(json.dumps(self.policy_version))

    def load(self, path: Path) -> None:
        self.policy_version = json.loads((path / "v.json").read_text())


def test_a_resume_restores_the_checkpointed_counters_through_restore(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    config = ServerConfig()
    store = SQLiteStore(tmp_path / "store.sqlite")
    c = TrainingCounters()
    first = Checkpoints(tmp_path / "ckpt", _Versioned(), store, c, lambda: config, FakeClock())
    c.stepped(1, episodes=4, samples=6, tokens=50, metrics={"loss": 0.5}, version=1)
    c.stepped(2, episodes=4, samples=5, tokens=40, metrics={"loss": 0.25}, version=2)
    c.drop_stale(3)
    c.drop_uniform(2)
    c.trained_type("math", 8, 3.0)
    first.engine.policy_version = 2
    saved = first.save()
    state = json.loads((saved / SERVER_STATE).read_text())
    assert {k: state[k] for k in CHECKPOINTED} == {"train_steps": 2, "trained_episodes": 8, "dropped_stale": 3,
                                                   "dropped_uniform": 2}  # the names checkpoints always had

    restores: list[dict] = []
    real = TrainingCounters.restore
    monkeypatch.setattr(TrainingCounters, "restore", lambda self, s: (restores.append(dict(s)), real(self, s)))
    again = TrainingCounters()
    second = Checkpoints(tmp_path / "ckpt", _Versioned(), store, again, lambda: config, FakeClock())
    assert second.resume() == 2 and len(restores) == 1
    assert again.checkpoint_state() == c.checkpoint_state()
    assert again.committed_version == 2  # the checkpoint's policy version: served again once the generator has it
    assert (again.trained_samples, again.trained_tokens, again.last_metrics, again.by_type) == (0, 0, {}, {})
    store.close()


def test_a_checkpoint_without_counters_restores_zeros() -> None:
    c = TrainingCounters(train_steps=5, dropped_stale=1)
    c.restore({"train_steps": 3})
    assert c.checkpoint_state() == {"train_steps": 3, "trained_episodes": 0, "dropped_stale": 0, "dropped_uniform": 0}


def _metric(text: str, name: str) -> float:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(name + " ")]
    return float(line.split()[1])


def test_status_dashboard_and_metrics_report_the_same_figures(make_server) -> None:
    srv = make_server(engine="tiny", admin_token=ADMIN, observe=ObserveSettings(read_token=READ))
    play_group(srv.url, "t1", [1.0, 0.0])  # trained
    wait_until(lambda: srv.server.counters.training.train_steps == 1, timeout=60)
    play_group(srv.url, "t2", [0.0, 0.0])  # uniform: dropped
    play_group(srv.url, "e", [0.5], eval=True)
    aborted = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "c2", "task_id": "a"}).json()
    httpx.post(f"{srv.url}/swarm/v1/episodes/{aborted['episode_id']}/abort",
               headers={"Authorization": f"Bearer {aborted['api_key']}"}, json={})
    httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "c3", "task_id": "o"})  # still open
    settle(srv)

    read = {"Authorization": f"Bearer {READ}"}
    admin = {"Authorization": f"Bearer {ADMIN}"}
    status = ServerStatus.model_validate(httpx.get(f"{srv.url}/swarm/v1/status", headers=admin).json())
    snap = httpx.get(f"{srv.url}/dashboard/api/run", params={"evals": "false"}, headers=read).json()["snapshot"]
    prom = httpx.get(f"{srv.url}/metrics", headers=read).text

    b = status.buffer
    assert (status.train_steps, status.policy_version, status.engine_state) == (1, 1, "ready")
    assert (snap["train_steps"], snap["policy_version"], snap["engine_state"]) == (1, 1, "ready")
    assert (b.open_episodes, b.pending_episodes, b.trained_episodes, b.eval_episodes) == (1, 0, 2, 1)
    assert (snap["open_episodes"], snap["pending_episodes"], snap["trained_episodes"], snap["eval_episodes"]) == (
        1, 0, 2, 1)
    assert (b.dropped_uniform_episodes, b.dropped_stale_episodes, b.aborted_episodes, b.expired_episodes) == (
        2, 0, 1, 0)
    assert snap["dropped"] == {"stale": 0, "uniform": 2, "expired": 0, "aborted": 1, "team_aborted": 0}
    assert len(status.clients) == snap["clients"] == 3
    for key in ("calls", "generated_tokens", "episodes_ended", "trained_tokens", "train_seconds"):
        assert status.throughput[key] == snap[key] > 0, key
    # the time in committed steps, the weight push apart (in place here: it moves nothing, but is timed)
    assert status.throughput["weight_sync_seconds"] == snap["weight_sync_seconds"] >= 0
    assert snap["train_seconds"] == pytest.approx(srv.server.counters.training.last_metrics["time/training_s"])
    assert _metric(prom, "agentjet_train_seconds_total") == pytest.approx(snap["train_seconds"])
    assert _metric(prom, "agentjet_weight_sync_seconds_total") == pytest.approx(snap["weight_sync_seconds"])
    assert {k: v for k, v in status.throughput.items() if k.startswith("tito_")} == snap["tito"]
    assert {k.removeprefix("admission_"): v for k, v in status.throughput.items()
            if k.startswith("admission_")} == snap["admission"]
    # the weight-sync seam (in place here): one push per committed step, none failed
    assert (status.weight_syncs, status.weight_sync_failures) == (snap["weight_syncs"], snap["weight_sync_failures"])
    assert (status.weight_syncs, status.weight_sync_failures) == (1, 0)
    assert _metric(prom, "agentjet_weight_syncs_total") == 1 and _metric(prom, "agentjet_weight_sync_failures_total") == 0
    assert _metric(prom, "agentjet_train_steps_total") == status.train_steps
    assert _metric(prom, "agentjet_open_episodes") == b.open_episodes
    assert _metric(prom, "agentjet_chat_calls_total") == status.throughput["calls"]
    assert _metric(prom, 'agentjet_dropped_episodes_total{reason="uniform"}') == b.dropped_uniform_episodes
    # the generator's batching counters: every generated token came from a prefill or a decode step's row
    gen = {k.removeprefix("generator_"): v for k, v in status.throughput.items() if k.startswith("generator_")}
    assert gen == snap["generator"] and gen["generate_requests"] >= status.throughput["calls"]
    assert gen["generated_tokens"] == gen["generate_requests"] + gen["decode_rows"] >= status.throughput["generated_tokens"]
    assert _metric(prom, "agentjet_generator_decode_steps_total") == gen["decode_steps"] > 0


def test_the_status_dashboard_metrics_and_cli_show_the_level_of_each_types_latest_training_episode(
        make_server) -> None:
    """Issue 51: a levelled run's clients note each episode's level; the status shows where each task type trains
    now. Eval episodes (scored at two levels) and anything but a level number leave it as it was."""
    from agentjet.cli.status_view import task_types_table

    srv = make_server(admin_token=ADMIN, observe=ObserveSettings(read_token=READ))  # the null engine
    admin, read = {"Authorization": f"Bearer {ADMIN}"}, {"Authorization": f"Bearer {READ}"}

    def status() -> ServerStatus:
        return ServerStatus.model_validate(httpx.get(f"{srv.url}/swarm/v1/status", headers=admin).json())

    play_group(srv.url, "plain", [1.0, 0.0], task_type="words")  # a type without levels
    assert status().levels == {}
    assert "agentjet_task_level" not in httpx.get(f"{srv.url}/metrics", headers=read).text
    play_group(srv.url, "t1", [1.0, 0.0], metadata={"level": 1})
    play_group(srv.url, "t2", [1.0, 0.0], metadata={"level": 2})
    play_group(srv.url, "e1", [0.5], eval=True, metadata={"level": 0})  # the eval at the task as named
    play_group(srv.url, "t3", [1.0], metadata={"level": "hard"})  # not a level number: ignored
    play_group(srv.url, "t4", [1.0], metadata={"level": True})
    play_group(srv.url, "g1", [0.0, 1.0], task_type="games", metadata={"level": 0})
    settle(srv)

    st = status()
    assert st.levels == {"math": 2, "games": 0}
    snap = httpx.get(f"{srv.url}/dashboard/api/run", params={"evals": "false"}, headers=read).json()["snapshot"]
    assert snap["levels"] == st.levels
    prom = httpx.get(f"{srv.url}/metrics", headers=read).text
    assert _metric(prom, 'agentjet_task_level{task_type="math"}') == 2
    assert _metric(prom, 'agentjet_task_level{task_type="games"}') == 0
    table = task_types_table(st)
    assert [c.header for c in table.columns] == ["type", "trained", "reward", "level"]
    rows = {cells[0]: cells[-1] for cells in zip(*(c._cells for c in table.columns), strict=True)}
    assert rows == {"games": "0", "math": "2", "words": "-"}


def test_an_engine_without_a_seam_shows_no_weight_syncs_and_old_answers_still_parse(make_server) -> None:
    srv = make_server(admin_token=ADMIN, observe=ObserveSettings(read_token=READ))  # the null engine
    status = httpx.get(f"{srv.url}/swarm/v1/status").json()
    assert status["weight_syncs"] is None and status["weight_sync_failures"] is None
    assert "agentjet_weight_syncs" not in httpx.get(f"{srv.url}/metrics",
                                                    headers={"Authorization": f"Bearer {READ}"}).text
    old = {k: v for k, v in status.items() if not k.startswith("weight_sync")}  # a server before these fields
    assert ServerStatus.model_validate(old).weight_syncs is None


FLEET_COUNTERS_FILE = SRC / "generators" / "fleet" / "counters.py"
FLEET_NOT_COUNTERS = {("fleet.py", "self.calls")}  # the fleet's call path (``Calls``), not ``ReplicaCounters.calls``


def test_the_fleets_counters_are_written_at_one_site_each() -> None:
    """The router's and each replica's counters (``generators/fleet/counters.py``, read into the snapshot through
    ``Generator.fleet()``) follow the read model's rule: each written in exactly one method of its class, and
    nowhere else in the fleet's package."""
    from agentjet.generators.fleet.counters import ReplicaCounters, RouterCounters

    for cls in (RouterCounters, ReplicaCounters):
        _, writers = _class_writers(FLEET_COUNTERS_FILE, cls)
        for name in _fields(cls):
            assert len(writers.get(name, [])) == 1, f"{cls.__name__}.{name} is written in {writers.get(name)}"
    names = _fields(RouterCounters) | _fields(ReplicaCounters)
    found = [f"{path.name}:{attr.lineno}: {ast.unparse(attr)}"
             for path in sorted((SRC / "generators" / "fleet").glob("*.py")) if path != FLEET_COUNTERS_FILE
             for attr in _written(ast.parse(path.read_text()))
             if attr.attr in names and (path.name, ast.unparse(attr)) not in FLEET_NOT_COUNTERS]
    assert found == [], "the fleet's counters are written only by their methods in generators/fleet/counters.py"
