"""`ajet research --ray` on a local two-node Ray cluster (opt-in: `make test-ray`; the ray extra).

A head node and a worker node, each declaring one CPU and one ``trial_slot`` (a custom resource): a trial reserves
half a CPU and one slot, so two trials run at a time, one on each node. A 3-run grid study on the tiny model (the embedded engine, the coin task):

1. the first two runs start, one on each node (recorded per attempt in ``study.json``);
2. the worker node is killed while its run is under way: its trial processes stop, and the run is retried on
   the head node, as a new attempt that is not counted as a crash;
3. the driver (``ajet research``) is SIGKILLed and started again: it finds its running Ray trial by the actor's
   name and re-attaches to it;
4. the study completes with three runs, each done, and four attempts in all; every attempt's logs and result came
   back into the study directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

import agentjet  # noqa: E402

pytestmark = pytest.mark.ray

COIN = Path(__file__).with_name("coin_task.py")
SRC = Path(agentjet.__file__).resolve().parents[1]


def write_study(tmp_path: Path, model: Path) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(f"""
question: Does the learning rate matter on the coin task (on a Ray cluster)?
base:
  servers:
    policy: {{model: {model}, options: {{group-size: 4, batch-groups: 2, checkpoint-every: 0, log-level: WARNING}}}}
client: {{task: {COIN}, steps: 6, eval_every: 3, eval_n: 16, concurrency: 4, time_budget_s: 120}}
space:
  server.lr: {{type: choice, choices: [1.0e-5, 1.0e-4, 3.0e-5], default: 1.0e-5}}
seeds: 1
parallel: 2
budget: {{trials: 3}}
planner: {{kind: grid}}
early_stop: {{enabled: false}}
health: {{poll_s: 0.5, stop_grace_s: 20, start_timeout_s: 300}}
ray: {{cpus: 0.5, resources: {{trial_slot: 1}}}}
""")
    return path


def load_state(out: Path) -> dict:
    try:
        return json.loads((out / "study.json").read_text())
    except (OSError, ValueError):
        return {"trials": []}


def wait_for(what: str, check, proc: subprocess.Popen, log: Path, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert proc.poll() is None, f"the driver exited while waiting for {what}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log.read_text()[-4000:]}"
        time.sleep(0.3)


def alive(pid: int | None, created: float | None) -> bool:
    try:
        p = psutil.Process(pid or 0)
        return abs(p.create_time() - (created or 0.0)) < 0.05 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch):
    # the nodes' workers (and the driver) import this checkout's agentjet
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]))
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"trial_slot": 1}})
    c.add_node(num_cpus=1, resources={"trial_slot": 1})
    c.wait_for_nodes()
    yield c
    c.shutdown()


def test_a_study_runs_on_two_nodes_survives_a_dead_node_and_a_restarted_driver(
        tmp_path: Path, tiny_model_path: Path, cluster: Cluster) -> None:
    started = time.monotonic()
    head_id = cluster.head_node.node_id
    (worker,) = cluster.worker_nodes
    worker_id = worker.node_id
    out = tmp_path / "study"
    cmd = [sys.executable, "-m", "agentjet.cli", "research", str(write_study(tmp_path, tiny_model_path)), "--out",
           str(out), "--ray", cluster.address]
    log1 = tmp_path / "driver1.log"
    with open(log1, "wb") as f:
        driver = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    try:
        # 1. two runs at a time, one on each node
        def both_ready() -> dict | None:
            runs = [t for t in load_state(out)["trials"] if t["attempts"] and t["state"] == "running"]
            ready = [t for t in runs if t["attempts"][-1]["ready"] and t["attempts"][-1]["node"]]
            nodes = {t["attempts"][-1]["node"].split()[1] for t in ready}
            return {t["attempts"][-1]["node"].split()[1]: t for t in ready} if nodes == {head_id, worker_id} else None

        by_node = wait_for("a ready run on each node", both_ready, driver, log1, 300)
        victim = by_node[worker_id]
        first = victim["attempts"][0]

        # 2. the worker node dies mid-trial
        cluster.remove_node(worker, allow_graceful=False)

        def retried() -> dict | None:
            t = next(t for t in load_state(out)["trials"] if t["id"] == victim["id"])
            return t if len(t["attempts"]) == 2 else None

        run = wait_for(f"{victim['id']} to be retried", retried, driver, log1, 120)
        assert run["attempts"][0]["outcome"].startswith("node lost"), run["attempts"][0]
        assert run["crashes"] == 0 and run["lost"] == 1
        deadline = time.monotonic() + 60  # the dead node's trial processes are stopped
        pids = [(first["pid"], first["create_time"]), *map(tuple, run["attempts"][0]["children"])]
        while any(alive(p, c) for p, c in pids) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(alive(p, c) for p, c in pids), pids

        # 3. the driver is SIGKILLed while a Ray trial runs, and started again
        def all_placed() -> bool:  # every running run started on a node (none waits for room), one at least
            running = [t for t in load_state(out)["trials"] if t["state"] == "running"]
            return bool(running) and all(t["attempts"][-1]["ready"] for t in running)

        wait_for("the runs under way placed", all_placed, driver, log1, 300)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
        assert "re-attached" in second.stdout or "collecting" in second.stdout, second.stdout[-4000:]
    finally:
        if driver.poll() is None:
            driver.kill()
        for t in load_state(out)["trials"]:  # a dead node's scratch dirs stay behind (here: in this machine's /tmp)
            for a in t["attempts"]:
                if a["outcome"] and a["outcome"].startswith("node lost") and a["actor"]:
                    shutil.rmtree(Path(tempfile.gettempdir()) / "agentjet-trials" / a["actor"], ignore_errors=True)

    # 4. three runs, done; four attempts in all (the retry counts once: no crash); files back in the study dir
    state = load_state(out)
    assert state["finished"] and state["sessions"] == 2
    runs = {t["id"]: t for t in state["trials"]}
    assert sorted(runs) == ["t000", "t001", "t002"]
    assert all(t["state"] == "done" and t["crashes"] == 0 for t in runs.values()), runs
    assert sum(len(t["attempts"]) for t in runs.values()) == 4
    assert runs[victim["id"]]["attempts"][1]["node"].split()[1] == head_id
    nodes = {a["node"].split()[1] for t in runs.values() for a in t["attempts"]}
    assert nodes == {head_id, worker_id}
    for t in runs.values():
        last = out / "trials" / t["id"] / f"attempt-{len(t['attempts'])}"
        assert (last / "result.json").exists() and (last / "up.log").exists(), sorted(last.rglob("*"))
        assert (last / "trial.yaml").exists() and list((last / "logs").glob("*.log"))
        assert not list(last.glob("server-*")), "the servers' data dirs stay on the node"
    rows = (out / "results.tsv").read_text().strip().splitlines()
    assert len(rows) == 4
    report = (out / "report.md").read_text()
    assert all(f"| {run_id} |" in report for run_id in runs)
    print(f"\n[ray study] wall time {time.monotonic() - started:.0f} s; attempts per node: "
          f"{[(t['id'], [a['node'].split()[1][:8] for a in t['attempts']]) for t in runs.values()]}")
