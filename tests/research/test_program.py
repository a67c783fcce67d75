"""A two-study program on the tiny model (null engine, coin task) from a topic, designed by a scripted LLM
endpoint: its first design is used; its next step names an unknown setting and is refused, so the offline
planner reads the first study's results and designs the second study, citing the first study's number. The
program is SIGKILLed during its first study and started again: it continues that study, then goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from tests.research.test_llm_planner import FakeOpenAI, fake  # noqa: F401  (the fixture)
from tests.research.test_study import COIN, load_state

TOPIC = "Does a larger GRPO group help on the coin task?"


@pytest.fixture
def program_dir(tmp_path: Path) -> Iterator[Path]:
    """The program directory; afterwards any trial process of its studies still alive is killed by pid."""
    out = tmp_path / "program"
    yield out
    for study in out.glob("studies/*"):
        for t in (load_state(study) or {"trials": []})["trials"]:
            for a in t["attempts"]:
                for pid, created in [(a["pid"], a["create_time"]), *a["children"]]:
                    try:
                        p = psutil.Process(pid)
                        if abs(p.create_time() - created) < 0.05:
                            p.kill()
                    except (psutil.Error, TypeError):
                        pass


def test_a_two_study_program_follows_from_the_first_report(tmp_path: Path, tiny_model_path: Path,
                                                           fake: FakeOpenAI, program_dir: Path) -> None:  # noqa: F811
    swarm = tmp_path / "swarm.yaml"
    swarm.write_text(f"""servers:
  policy: {{model: {tiny_model_path}, options: {{engine: "null", batch-groups: 2, checkpoint-every: 0,
            log-level: WARNING}}}}
""")
    fake.replies = [
        json.dumps({"question": TOPIC, "task": "addition", "seeds": 1, "trials": 2,
                    "knobs": [{"name": "server.group-size", "type": "choice", "choices": [2, 4],
                               "reason": "the topic asks about the group"}]}),
        json.dumps({"action": "narrow", "why": "look closer", "cites": "0.5",
                    "design": {"knobs": [{"name": "server.no-such-setting", "type": "float"}]}}),
    ]
    out = program_dir
    cmd = [sys.executable, "-m", "agentjet.cli", "research", TOPIC, "--program", "--base", str(swarm),
           "--client", f"task={COIN}", "--client", "steps=3", "--client", "eval_every=3", "--client", "concurrency=4",
           "--client", "time_budget_s=60", "--trials", "4", "--planner-url", fake.url, "--out", str(out)]
    with open(tmp_path / "session1.log", "wb") as log:
        first_session = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 150
    while True:  # kill the program once the first study's first run is done
        assert first_session.poll() is None, (tmp_path / "session1.log").read_text()
        assert time.monotonic() < deadline, "the first run did not finish in time"
        studies = list(out.glob("studies/01-*"))
        state = load_state(studies[0]) if studies else None
        if state and any(t["state"] == "done" for t in state["trials"]):
            break
        time.sleep(0.2)
    os.kill(first_session.pid, signal.SIGKILL)
    first_session.wait()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    state = json.loads((out / "program.json").read_text())
    assert state["finished"] and [s["state"] for s in state["studies"]] == ["done", "done"]
    first, second = state["studies"]
    assert first["design"]["planner"] == "llm" and first["dir"] != second["dir"]
    assert load_state(out / first["dir"])["sessions"] == 2 and load_state(out / second["dir"])["sessions"] == 1
    assert len([t for t in load_state(out / first["dir"])["trials"] if t["state"] == "done"]) == 2
    for s in (first, second):
        assert (out / s["dir"] / "study.json").exists() and (out / s["dir"] / "report.md").exists()
        assert (out / s["dir"] / "spec.yaml").exists() and (out / s["dir"] / "design.md").exists()
    # the refused next step fell back to the offline planner, which read the first study's results
    assert "dropped unknown setting 'server.no-such-setting'" in done.stdout.replace("\n", "")
    results = json.loads((out / first["dir"] / "results.json").read_text())["configs"]
    means = sorted(r["mean"] for r in results if r["mean"] is not None)
    assert len(means) == 2 and f"best ahead by {means[1] - means[0]:.3f}" in second["cites"]
    assert second["why"].startswith("more_seeds") and second["design"]["seeds"] == 2  # one seed each: more seeds
    assert "Does a larger GRPO group help" in fake.requests[0]["messages"][1]["content"]
    assert json.dumps(results[0]["params"]) in fake.requests[1]["messages"][1]["content"]  # the LLM saw the report
    log = (out / "log.md").read_text()
    assert "Asked:" in log and "Study 1 found" in log and "Next, study 2 (more_seeds)" in log and "budget" in log
    program = (out / "program.md").read_text()
    assert "Program: " in program and "when the budget ran out, best" in program and "evidence: study 2" in program
    # started again, a finished program runs nothing
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and json.loads((out / "program.json").read_text())["sessions"] == 3
    assert len(fake.requests) == 2
