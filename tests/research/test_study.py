"""`ajet research` end to end on the null engine (CI: 60 s on the 2-core machine under the CPU lock).

A 2-parameter grid study of 4 runs on the coin task: the runs whose replies are cut short (max_tokens 4)
trail by ~0.7 and are pruned at their first rung. Two good runs differ by more than the 0.3 margin about
once in 10,000 studies (eval points of 48 episodes). The study process is SIGKILLed while its second run
is under way and started again: the finished run is not run again, the running one is re-attached to,
and the report lists every run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

COIN = Path(__file__).with_name("coin_task.py")
CRASH_ONCE = Path(__file__).with_name("crash_once_client.py")


def write_study(tmp_path: Path, model: Path, extra: str = "", clients: str = "") -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(f"""
question: Does the reply length cap matter on the coin task?
base:
  servers:
    policy: {{model: {model}, options: {{engine: "null", group-size: 4, batch-groups: 2, checkpoint-every: 0,
              log-level: WARNING}}}}
{clients}
client: {{task: {COIN}, steps: 6, eval_every: 3, concurrency: 4, time_budget_s: 90}}
space:
  client.max_tokens: {{type: choice, choices: [16, 4], default: 16}}
  server.lr: {{type: choice, choices: [1.0e-5, 1.0e-4], default: 1.0e-5}}
seeds: 1
budget: {{trials: 4}}
planner: {{kind: grid}}
early_stop: {{min_delta: 0.3}}
health: {{poll_s: 0.3, stop_grace_s: 30}}
{extra}
""")
    return path


def load_state(out: Path) -> dict | None:
    try:
        return json.loads((out / "study.json").read_text())
    except (OSError, ValueError):
        return None


@pytest.fixture
def study_dir(tmp_path: Path):
    """The study directory; afterwards, any trial process still alive is killed by pid (a failed test
    must not leave servers behind)."""
    out = tmp_path / "study"
    yield out
    state = load_state(out) or {"trials": []}
    for t in state["trials"]:
        for a in t["attempts"]:
            for pid, created in [(a["pid"], a["create_time"]), *a["children"]]:
                try:
                    p = psutil.Process(pid)
                    if abs(p.create_time() - created) < 0.05:
                        p.kill()
                except (psutil.Error, TypeError):
                    pass


def research_cmd(spec: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "agentjet.cli", "research", str(spec), "--out", str(out)]


def trial_starts(out: Path) -> int:
    """How many times a trial client was started, over every attempt of every run (from `ajet up` logs)."""
    return sum(p.read_text().count("started trial (pid") for p in out.glob("trials/*/attempt-*/up.log"))


def test_study_is_killed_mid_study_and_resumed(tmp_path: Path, tiny_model_path: Path, study_dir: Path) -> None:
    spec = write_study(tmp_path, tiny_model_path)
    with open(tmp_path / "session1.log", "wb") as log:
        first = subprocess.Popen(research_cmd(spec, study_dir), stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 150
    while True:
        assert first.poll() is None, (tmp_path / "session1.log").read_text()
        assert time.monotonic() < deadline, "the first run did not finish in time"
        state = load_state(study_dir)
        by_id = {t["id"]: t for t in (state or {"trials": []})["trials"]}
        if by_id.get("t000", {}).get("state") == "done" and by_id.get("t001", {}).get("state") == "running" \
                and by_id["t001"]["attempts"] and by_id["t001"]["attempts"][-1]["ready"]:
            break
        time.sleep(0.2)
    finished_result = study_dir / "trials/t000/attempt-1/result.json"
    before = finished_result.stat().st_mtime_ns
    os.kill(first.pid, signal.SIGKILL)  # mid-study: t001's `ajet up` lives on in its own session
    first.wait()

    second = subprocess.run(research_cmd(spec, study_dir), capture_output=True, text=True, timeout=240)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "t001" in second.stdout and ("re-attached" in second.stdout or "collecting" in second.stdout)

    state = load_state(study_dir)
    assert state is not None and state["sessions"] == 2 and state["finished"]
    runs = {t["id"]: t for t in state["trials"]}
    assert sorted(runs) == ["t000", "t001", "t002", "t003"]
    # no run ran twice: one attempt each, four trial clients started in all, the finished run untouched
    assert all(len(t["attempts"]) == 1 for t in runs.values()), {k: t["attempts"] for k, t in runs.items()}
    assert trial_starts(study_dir) == 4
    assert finished_result.stat().st_mtime_ns == before
    assert not (study_dir / "trials/t000/attempt-2").exists()
    # the truncated configurations are pruned at their first rung (step 3; a step may slip in before the
    # pause); the others ran every step
    for t in runs.values():
        if t["params"]["client.max_tokens"] == 4:
            assert t["state"] == "pruned" and 3 <= t["points"][-1]["step"] < 6, t
        else:
            assert t["state"] == "done" and t["points"][-1]["step"] >= 6, t
    report = (study_dir / "report.md").read_text()
    for run_id in runs:
        assert f"| {run_id} |" in report
    for config in ("c00", "c01", "c02", "c03"):
        assert f"| {config} |" in report
    assert "The default configuration is the best one found" in report or "beats the default" in report
    assert (study_dir / "metric_vs_step.png").exists()
    rows = (study_dir / "results.tsv").read_text().strip().splitlines()
    assert len(rows) == 5 and rows[0].startswith("run\tconfig\tseed\tstate")
    assert not list(study_dir.glob("trials/*/attempt-*/server-*/checkpoints"))


def test_a_crashed_run_is_retried_once(tmp_path: Path, tiny_model_path: Path, study_dir: Path) -> None:
    marker = tmp_path / "crashed-once"
    clients = f"""  clients:
    trial: {{command: ["{sys.executable}", "{CRASH_ONCE}", "{marker}", "--", "--server", "{{server_url}}",
             "--settings", "{tmp_path / 'client.json'}", "--seed", "{{seed}}", "--out", "{{trial_dir}}"]}}"""
    (tmp_path / "client.json").write_text(json.dumps({"task": str(COIN), "steps": 3, "eval_every": 3}))
    spec = write_study(tmp_path, tiny_model_path, clients=clients, extra="")
    text = spec.read_text().replace("budget: {trials: 4}", "budget: {trials: 1}")
    text = text.replace("client.max_tokens: {type: choice, choices: [16, 4], default: 16}",
                        "client.max_tokens: {type: choice, choices: [16], default: 16}")
    spec.write_text(text)
    done = subprocess.run(research_cmd(spec, study_dir), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = load_state(study_dir)["trials"]
    assert run["state"] == "done" and run["crashes"] == 1 and len(run["attempts"]) == 2
    assert run["attempts"][0]["outcome"].startswith("crashed")
    assert "restarting it" in done.stdout


def test_a_bad_server_option_fails_the_study_before_any_run(tmp_path: Path, tiny_model_path: Path,
                                                            study_dir: Path) -> None:
    spec = write_study(tmp_path, tiny_model_path)
    spec.write_text(spec.read_text().replace("group-size: 4", "group-size: 4, no-such-option: 1"))
    done = subprocess.run(research_cmd(spec, study_dir), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown setting 'no-such-option'" in done.stdout, done.stdout + done.stderr
    assert not (study_dir / "trials").exists()


def test_a_study_whose_servers_never_start_is_aborted_with_the_log(tmp_path: Path, tiny_model_path: Path,
                                                                   study_dir: Path) -> None:
    spec = write_study(tmp_path, tmp_path / "no-such-model")  # valid settings, but the model cannot load
    done = subprocess.run(research_cmd(spec, study_dir), capture_output=True, text=True, timeout=240)
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout.replace("\n", "")  # rich folds a long path at the terminal width
    assert "study aborted" in out and "no-such-model" in out, done.stdout
    (run, *_) = load_state(study_dir)["trials"]
    assert run["state"] == "failed" and len(run["attempts"]) == 2
