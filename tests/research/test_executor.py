"""The study loop's side of running trials elsewhere (a Ray cluster), with a fake executor: no Ray, no servers.

The fake's "nodes" keep each attempt's files in a directory of their own; they come back into the study directory
through the same :class:`FileSync` and :func:`apply_chunks` the Ray executor uses. A fake node can die under a run
(``lost``) or hold a run before it starts (``waiting``), and the study process can die mid-study and start again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agentjet.apps.research.executor import FileSync, Look, TrialTemplate, apply_chunks
from agentjet.apps.research.monitor import TrialResult, read_result
from agentjet.apps.research.runner import StudyRunner
from agentjet.apps.research.spec import StudySpec, validate_spec
from agentjet.apps.research.state import Attempt, StudyState, StudyStore, TrialRecord, TrialState
from agentjet.apps.research.study import Study
from agentjet.apps.research.trial_client import write_result
from agentjet.observe.learncurve import EvalPoint

LRS = [1.0e-5, 1.0e-4, 3.0e-5]


def make_spec(tmp_path: Path, trials: int = 3, start_timeout_s: float = 600) -> StudySpec:
    return validate_spec({
        "question": "Which learning rate?",
        "base": {"servers": {"policy": {"model": str(tmp_path / "model"), "options": {"engine": "null"}}}},
        "client": {"steps": 2, "eval_every": 1},
        "space": {"server.lr": {"type": "choice", "choices": LRS, "default": LRS[0]}},
        "seeds": 1, "parallel": 2, "budget": {"trials": trials}, "planner": {"kind": "grid"},
        "early_stop": {"enabled": False}, "health": {"poll_s": 0.01, "stop_grace_s": 1, "start_timeout_s": start_timeout_s},
    }, "the test study", tmp_path)


class FakeActor:
    """One attempt on a fake node: it writes a log line per poll, then its result."""

    def __init__(self, root: Path, run: TrialRecord, node: str, polls: int) -> None:
        self.dir = root
        self.run = run
        self.node = node
        self.polls_to_finish = polls
        self.polls = 0
        self.dead = False
        self.stopped = False
        self.sync = FileSync(root)
        (root / "logs").mkdir(parents=True)
        (root / "server-policy" / "checkpoints").mkdir(parents=True)
        (root / "server-policy" / "checkpoints" / "big.bin").write_bytes(b"x" * 1000)
        (root / "trial.yaml").write_text(f"run: {run.id}\n")

    def step(self) -> None:
        if self.stopped or self.polls >= self.polls_to_finish:
            return
        self.polls += 1
        with open(self.dir / "up.log", "a") as f:
            f.write(f"{self.run.id} poll {self.polls} on {self.node}\n")
        with open(self.dir / "logs" / "trial.log", "a") as f:
            f.write("x" * 100 + "\n")
        if self.polls == self.polls_to_finish:
            lr = float(self.run.params["server.lr"])
            evals = [EvalPoint(train_steps=s, policy_version=s, reward=0.5 + lr * 1000 * s, episodes=8) for s in (0, 1, 2)]
            write_result(self.dir, TrialResult(stop_reason="steps", evals=evals))

    @property
    def finished(self) -> bool:
        return self.polls >= self.polls_to_finish


class FakeHandle:
    def __init__(self, cluster: FakeCluster, name: str, attempt_dir: Path, resync: bool = False) -> None:
        self.cluster = cluster
        self.name = name
        self.dir = attempt_dir
        self.resync = resync

    def poll(self) -> Look:
        actor = self.cluster.actors.get(self.name)
        if actor is None or actor.dead:
            return Look(alive=False, lost="its node died")
        if self.name in self.cluster.hold:
            return Look(waiting="no room")
        actor.step()
        if actor.run.id in self.cluster.kill_after and actor.polls >= self.cluster.kill_after[actor.run.id]:
            del self.cluster.kill_after[actor.run.id]
            actor.dead = True
            return Look(alive=False, lost="its node died")
        if self.resync:
            actor.sync.reset()
            self.resync = False
        apply_chunks(self.dir, actor.sync.changes())
        return Look(alive=not actor.finished, result=read_result(self.dir))

    def record(self, attempt: Attempt) -> bool:
        actor = self.cluster.actors.get(self.name)
        changed = actor is not None and attempt.node != actor.node
        if actor is not None:
            attempt.node = actor.node
        return changed

    def stop(self, grace_s: float, keep_checkpoints: bool) -> None:
        actor = self.cluster.actors.pop(self.name, None)
        if actor is not None and not actor.dead:
            actor.stopped = True
            apply_chunks(self.dir, actor.sync.changes())
        self.cluster.stopped.append(self.name)


class FakeCluster:
    """Two nodes; ``kill_after``: run id -> the poll at which its first attempt's node dies."""

    name = "fake"

    def __init__(self, root: Path, polls: int = 3, kill_after: dict[str, int] | None = None) -> None:
        self.root = root
        self.polls = polls
        self.kill_after = dict(kill_after or {})
        self.actors: dict[str, FakeActor] = {}
        self.launched: list[str] = []
        self.stopped: list[str] = []
        self.hold: set[str] = set()
        self._n = 0

    def check(self, template: TrialTemplate) -> None:
        pass

    def launch(self, template: TrialTemplate, run: TrialRecord, attempt: Attempt, attempt_dir: Path) -> FakeHandle:
        name = f"{run.id}-a{attempt.number}"
        alive_nodes = ["node-a", "node-b"]
        node = alive_nodes[self._n % 2]
        self._n += 1
        self.actors[name] = FakeActor(self.root / name, run, node, self.polls)
        self.launched.append(name)
        attempt.actor = name
        return FakeHandle(self, name, attempt_dir)

    def attach(self, template: TrialTemplate, run: TrialRecord, attempt: Attempt, attempt_dir: Path) -> FakeHandle:
        assert attempt.actor is not None
        return FakeHandle(self, attempt.actor, attempt_dir, resync=True)

    def close(self) -> None:
        pass


class Killed(BaseException):
    """The study process dies (SIGKILL): nothing is stopped, the lock is let go."""


def run_study(spec: StudySpec, out: Path, cluster: FakeCluster, sleep=lambda s: None) -> StudyState:
    with Study(spec, out, cluster) as study:
        return StudyRunner(study, sleep=sleep).run()


def load(out: Path) -> StudyState:
    return StudyStore(out).load()


def test_a_run_whose_node_dies_is_retried_once_and_counted_once(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    cluster = FakeCluster(tmp_path / "nodes", polls=3, kill_after={"t001": 2})
    state = run_study(spec, tmp_path / "study", cluster)
    assert state.finished
    runs = {t.id: t for t in state.trials}
    assert sorted(runs) == ["t000", "t001", "t002"]
    assert all(t.state is TrialState.DONE for t in runs.values())
    lost = runs["t001"]
    assert [a.outcome for a in lost.attempts][0].startswith("node lost: its node died")
    assert lost.crashes == 0 and lost.lost == 1 and len(lost.attempts) == 2
    assert [p.train_steps for p in lost.points] == [0, 1, 2]  # only the retry's points
    assert all(len(t.attempts) == 1 for t in (runs["t000"], runs["t002"]))
    assert {a.node for t in runs.values() for a in t.attempts} == {"node-a", "node-b"}
    assert "t001-a1" in cluster.stopped  # the dead attempt was stopped too (where its node still answers)
    rows = (tmp_path / "study" / "results.tsv").read_text().strip().splitlines()
    assert len(rows) == 4  # a header and one row per run: the lost attempt is not a row
    # the lost attempt's partial log came back as far as it got; the retry's whole
    a1 = tmp_path / "study" / "trials" / "t001" / "attempt-1"
    assert (a1 / "up.log").read_text().count("poll") == 1 and not (a1 / "result.json").exists()


def test_results_and_logs_come_back_into_the_study_directory(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, trials=1)
    cluster = FakeCluster(tmp_path / "nodes", polls=4)
    state = run_study(spec, tmp_path / "study", cluster)
    (run,) = state.trials
    adir = tmp_path / "study" / "trials" / run.id / "attempt-1"
    assert run.state is TrialState.DONE and run.value(spec.metric) == pytest.approx(0.5 + 1e-5 * 1000 * 2)
    assert (adir / "up.log").read_text().splitlines() == [f"t000 poll {n} on node-a" for n in (1, 2, 3, 4)]
    assert (adir / "logs" / "trial.log").read_text() == ("x" * 100 + "\n") * 4
    assert (adir / "trial.yaml").exists() and read_result(adir) is not None
    assert not (adir / "server-policy").exists()  # the servers' data dirs stay on the node
    report = json.loads((tmp_path / "study" / "results.json").read_text())
    assert report


def test_a_restarted_study_finds_its_trials_again_or_retries_them(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    cluster = FakeCluster(tmp_path / "nodes", polls=6)
    out = tmp_path / "study"
    calls = {"n": 0}

    def die_after_two_polls(_: float) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise Killed

    with pytest.raises(Killed):
        run_study(spec, out, cluster, sleep=die_after_two_polls)
    before = load(out)
    running = [t for t in before.trials if t.state is TrialState.RUNNING]
    assert [t.id for t in running] == ["t000", "t001"] and not cluster.stopped  # they live on, on their nodes
    assert all(t.attempt is not None and t.attempt.actor in cluster.actors for t in running)
    cluster.actors["t001-a1"].dead = True  # t001's node dies while the study is down

    state = run_study(spec, out, cluster)
    runs = {t.id: t for t in state.trials}
    assert state.finished and all(t.state is TrialState.DONE for t in runs.values())
    assert len(runs["t000"].attempts) == 1  # found again: re-attached, not run twice
    assert cluster.launched.count("t000-a1") == 1 and "t000-a2" not in cluster.launched
    assert len(runs["t001"].attempts) == 2 and runs["t001"].crashes == 0  # gone: retried
    assert runs["t001"].attempts[0].outcome == "interrupted"
    log = (out / "trials" / "t000" / "attempt-1" / "up.log").read_text().splitlines()
    assert log == [f"t000 poll {n} on node-a" for n in range(1, 7)]  # sent again from the start, whole, once


def test_a_run_waiting_for_room_is_not_timed_out(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, trials=1, start_timeout_s=0.15)  # the fake server never answers its status
    cluster = FakeCluster(tmp_path / "nodes", polls=2)
    cluster.hold.add("t000-a1")
    waits = {"n": 0}

    def sleep(_: float) -> None:
        waits["n"] += 1
        time.sleep(0.02)
        if waits["n"] == 20:
            cluster.hold.clear()  # a node frees up after 0.4 s: more than the start timeout

    state = run_study(spec, tmp_path / "study", cluster, sleep=sleep)
    (run,) = state.trials
    assert run.state is TrialState.DONE and run.crashes == 0 and len(run.attempts) == 1
    assert waits["n"] >= 20


def test_a_directory_holding_another_study_is_refused(tmp_path: Path) -> None:
    from agentjet.apps.research.spec import StudySpecError

    spec, out = make_spec(tmp_path, trials=1), tmp_path / "study"
    cluster = FakeCluster(tmp_path / "nodes")
    with Study(spec, out, cluster) as study:
        assert study.state.sessions == 1 and (out / "spec.yaml").exists()
    other = spec.model_copy(update={"seeds": 2})  # part of the digest
    with pytest.raises(StudySpecError, match="holds a different study"):
        Study(other, out, cluster)
    with Study(spec, out, cluster) as again:  # the refused open changed nothing and left the directory free
        assert again.state.sessions == 2


def test_a_pruned_run_takes_its_unstarted_seeds_with_it(tmp_path: Path) -> None:
    spec = make_spec(tmp_path).model_copy(update={"seeds": 2, "parallel": 1})
    cluster = FakeCluster(tmp_path / "nodes")
    with Study(spec, tmp_path / "study", cluster) as study:
        study.fill()
        assert list(study.active) == ["t000"] and [t.state for t in study.state.trials] == [TrialState.RUNNING,
                                                                                            TrialState.PLANNED]
        study.prune(study.active["t000"], 2, 0.1)
        first, second = study.state.trials
        assert not study.active and cluster.stopped == ["t000-a1"]
        assert first.state is TrialState.PRUNED and first.reason.startswith("stopped at step 2: 0.100")
        assert first.attempts[0].outcome == "pruned"
        assert second.state is TrialState.PRUNED and not second.attempts
        assert second.reason == "not run: seed 0 of this configuration was pruned at step 2"
    assert load(tmp_path / "study").trials[1].state is TrialState.PRUNED  # saved


def test_file_sync_sends_what_grew_resends_what_was_replaced_and_stays_inside(tmp_path: Path) -> None:
    node, driver = tmp_path / "node", tmp_path / "driver"
    node.mkdir()
    sync = FileSync(node)
    (node / "up.log").write_text("one\n")
    apply_chunks(driver, sync.changes())
    with open(node / "up.log", "a") as f:
        f.write("two\n")
    chunks = sync.changes()
    assert chunks == [("up.log", 4, b"two\n")]
    apply_chunks(driver, chunks)
    apply_chunks(driver, chunks)  # twice: the same file
    assert (driver / "up.log").read_text() == "one\ntwo\n"
    assert sync.changes() == []
    (node / "evals.jsonl").write_text("a")
    (node / "evals.jsonl.new").write_text("bb")
    (node / "evals.jsonl.new").replace(node / "evals.jsonl")  # replaced (another inode): sent whole
    apply_chunks(driver, sync.changes())
    assert (driver / "evals.jsonl").read_text() == "bb"
    sync.reset()  # a restarted driver: everything again, the same files
    apply_chunks(driver, sync.changes())
    assert (driver / "up.log").read_text() == "one\ntwo\n"
    apply_chunks(driver, [("../outside.txt", 0, b"no")])
    assert not (tmp_path / "outside.txt").exists()


def test_ray_missing_is_a_clear_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util

    from typer.testing import CliRunner

    from agentjet.cli import app

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    result = CliRunner().invoke(app, ["research", "Does a larger GRPO group help?", "--ray", "auto",
                                      "--out", str(tmp_path / "s")])
    assert result.exit_code != 0
    assert "agentjet[ray]" in result.output, result.output
    assert not (tmp_path / "s").exists()


def test_a_trial_no_node_holds_and_an_address_that_does_not_answer_are_refused(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    import socket

    from agentjet.apps.research.ray_executor import fits, reachable, trial_demand
    from agentjet.apps.research.spec import StudySpecError

    spec = make_spec(tmp_path)
    spec = spec.model_copy(update={"ray": spec.ray.model_copy(update={"gpus_per_server": 2, "resources": {"slot": 1}})})
    demand = trial_demand(TrialTemplate.of(spec))
    assert demand == {"num_cpus": 1.0, "num_gpus": 2.0, "resources": {"slot": 1}}
    small = {"Alive": True, "Resources": {"CPU": 8, "GPU": 1, "slot": 1}}
    big = {"Alive": True, "Resources": {"CPU": 8, "GPU": 2, "slot": 1}}
    assert not fits(demand, [small]) and fits(demand, [small, big]) and not fits(demand, [{**big, "Alive": False}])
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StudySpecError, match="no Ray cluster answers"):
        reachable(f"127.0.0.1:{port}")
    reachable("auto")  # left to Ray


def test_the_trial_spec_comes_back_readable_by_its_owner_only(tmp_path: Path) -> None:
    apply_chunks(tmp_path, [("trial.yaml", 0, b"admin_token: secret\n"), ("up.log", 0, b"log\n")])
    assert (tmp_path / "trial.yaml").stat().st_mode & 0o077 == 0
    assert (tmp_path / "trial.yaml").read_text() == "admin_token: secret\n"


def test_the_ray_options_of_a_topic_reach_its_designed_study() -> None:
    from agentjet.apps.research.app import topic_extra

    extra = topic_extra([], {"ray.cpus": 2.0, "ray.gpus_per_server": 1.0, "seeds": 2})
    assert extra["ray"] == {"cpus": 2.0, "gpus_per_server": 1.0} and extra["seeds"] == 2
