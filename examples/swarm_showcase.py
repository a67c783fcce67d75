"""A recorded run of what centralized frameworks cannot do, on one CPU machine:

- two servers, each training its own model (planner: SmolLM2-135M, executor: the tiny model), fed by one
  two-model team workflow;
- cocktail training on the planner server: team episodes ("math") and a second client process ("words")
  at 70/30 of every batch;
- live iteration: halfway through, the words client is SIGKILLed, its reward code is edited, and it is
  restarted with the same client id and cursor, while both servers keep training.

    python examples/swarm_showcase.py --minutes 10 --out runs/showcase

Prints the step timeline around the client replacement, the measured batch ratios and both servers'
policy versions, and saves everything to <out>/showcase.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from agentjet.apps.up import ClientSpec, Swarm, SwarmSpec, server_spec
from agentjet.runtime.launch import free_port

HERE = Path(__file__).resolve().parent
WORDS_V2 = '''"""Reward code for the 'words' task, version 2: edited while training runs (whole word first)."""


def reward(word: str, text: str) -> float:
    if word.upper() in (text or ""):
        return 1.0
    caps = set(c for c in (text or "") if c.isupper())
    return 0.5 * sum(c.upper() in caps for c in word) / len(word)
'''


def status(url: str) -> dict:
    try:
        return httpx.get(f"{url}/swarm/v1/status", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return {}


def words_client(url: str, out: Path, reward_file: Path) -> list[str]:
    return [sys.executable, str(HERE / "cocktail_client.py"), "--server", url, "--task-type", "words",
            "--client-id", "words-client", "--cursor", str(out / "words.cursor"), "--reward-file", str(reward_file)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--planner-model", default="smollm2-135m-instruct")
    p.add_argument("--executor-model", default="tiny-random")
    p.add_argument("--out", type=Path, default=Path("runs/showcase"))
    args = p.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    pa, pb = free_port(), free_port()
    a, b = f"http://127.0.0.1:{pa}", f"http://127.0.0.1:{pb}"
    common = {"group-size": 4, "checkpoint-every": 0, "max-staleness": 4, "log-level": "INFO"}
    logs = out / "logs"
    spec = SwarmSpec(
        servers={
            "planner": server_spec("planner", {"model": args.planner_model, "port": pa, "data_dir": str(out / "planner"),
                                               "options": {**common, "batch-groups": 10, "lr": 2e-5,
                                                           "task-ratios": "math=0.7,words=0.3",
                                                           "absent-policy": "strict"}}, logs),
            "executor": server_spec("executor", {
                "model": args.executor_model, "port": pb, "data_dir": str(out / "executor"),
                "options": {**common, "batch-groups": 2, "lr": 1e-3},
                "env": {"OMP_NUM_THREADS": "1"}}, logs),  # the tiny model needs one core, not both
        },
        clients={
            "team": ClientSpec(command=[sys.executable, str(HERE / "team_two_models.py"), "--planner", a,
                                        "--executor", b, "--tasks", "100000"]),
            "words": ClientSpec(command=words_client(a, out, HERE / "rewards" / "words_v1.py")),
        },
        log_dir=logs)
    swarm = Swarm(spec)
    timeline: list[dict] = []
    replaced_at = None
    start = time.monotonic()
    try:
        swarm.start()
        while (elapsed := time.monotonic() - start) < args.minutes * 60:
            sa, sb = status(a), status(b)
            timeline.append({"t": round(elapsed, 1), "planner_steps": sa.get("train_steps"),
                             "planner_version": sa.get("policy_version"), "executor_steps": sb.get("train_steps"),
                             "executor_version": sb.get("policy_version")})
            if replaced_at is None and elapsed > args.minutes * 30:
                proc = swarm.procs["words"]
                os.killpg(proc.pid, signal.SIGKILL)  # a crash, not a clean exit
                proc.wait()
                v2 = out / "words_v2.py"
                v2.write_text(WORDS_V2)  # the edited reward code
                log = open(out / "logs" / "words.log", "ab")  # noqa: SIM115
                swarm.procs["words"] = subprocess.Popen(words_client(a, out, v2), stdout=log,
                                                        stderr=subprocess.STDOUT, start_new_session=True)
                replaced_at = elapsed
                print(f"[{elapsed:6.1f}s] words client SIGKILLed and restarted with edited reward code", flush=True)
            time.sleep(2.0)
    finally:
        swarm.stop()

    db = sqlite3.connect(out / "planner" / "store.sqlite")
    steps = [(s, v, json.loads(m), t) for s, v, m, t in db.execute(
        "SELECT step, policy_version, metrics, created_at FROM steps ORDER BY step")]
    shares = [{k: round(v, 3) for k, v in m.items() if k.startswith("share/")} for _, _, m, _ in steps]
    # the words client's tasks before and after its replacement: the cursor resumes, nothing is redone
    replaced_wall = time.time() - (time.monotonic() - start) + replaced_at if replaced_at is not None else None
    words = list(db.execute("SELECT task_id, ended_at FROM episodes WHERE task_type = 'words'"))
    before = sorted({t for t, e in words if replaced_wall is not None and e < replaced_wall})
    after = sorted({t for t, e in words if replaced_wall is None or e >= replaced_wall})
    pairs = list(zip(steps, steps[1:], strict=False))
    gaps = [b[3] - a[3] for a, b in pairs]
    around = [gap for (a, b), gap in zip(pairs, gaps, strict=True)
              if replaced_wall is not None and a[3] <= replaced_wall < b[3]]
    step_times = [t for *_, t in steps]
    t0 = step_times[0] if step_times else 0
    result = {
        "minutes": args.minutes, "planner_model": args.planner_model, "executor_model": args.executor_model,
        "planner_final": timeline[-1] if timeline else {}, "replaced_at_s": replaced_at,
        "planner_batch_shares": shares, "planner_step_times_s": [round(t - t0, 1) for t in step_times],
        "median_step_interval_s": statistics.median(gaps) if gaps else None,
        "max_step_interval_s": max(gaps) if gaps else None,
        "step_interval_across_replacement_s": around[0] if around else None,
        "words_tasks": {"before_replacement": len(before), "after_replacement": len(after),
                        "done_twice": sorted(set(before) & set(after))},
        "timeline": timeline,
    }
    (out / "showcase.json").write_text(json.dumps(result, indent=2))
    last = timeline[-1] if timeline else {}
    print(f"\nplanner: {last.get('planner_steps')} steps (policy v{last.get('planner_version')}); "
          f"executor: {last.get('executor_steps')} steps (policy v{last.get('executor_version')})")
    print(f"planner batch shares (math/words): {[(s.get('share/math'), s.get('share/words')) for s in shares]}")
    print(f"planner step interval: median {result['median_step_interval_s']}, max {result['max_step_interval_s']} "
          f"(client replaced at {replaced_at}s; the interval across it: {result['step_interval_across_replacement_s']})")
    print(f"words tasks: {len(before)} before the replacement, {len(after)} after, "
          f"done twice: {result['words_tasks']['done_twice'] or 'none'}")
    print(f"saved {out / 'showcase.json'}")


if __name__ == "__main__":
    main()
