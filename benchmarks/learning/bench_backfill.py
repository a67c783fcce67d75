"""Backfill the ``ajet bench`` history with a past commit's learning curve: run that commit's own ``ajet demo``
with the learn suite's settings and append the result as a ``learn`` record marked ``backfilled``.

    python benchmarks/learning/bench_backfill.py COMMIT --seed 0 --budget-min 5 [--task addition]

1. ``git worktree add --detach`` a temporary worktree at COMMIT;
2. read its ``ajet demo --help`` (run as ``python -m agentjet.cli`` with PYTHONPATH=<worktree>/src and this
   interpreter: the commit's code, today's environment) and keep the learn suite's flags
   (``agentjet.apps.bench.suite.demo_flags``) that it has. The first demos lack ``--seed``, ``--eval-every-s`` and
   ``--no-early-stop``: they ran without them (the record's notes and ``settings.bench`` say which);
3. run the demo there (cwd: the worktree, so its provenance names COMMIT), convert its ``demo_result.json`` with
   ``agentjet.apps.bench.report.record_from_demo`` (any demo format since the first one) and append the record;
4. remove the worktree.

``--from-json FILE`` converts a demo result that exists already (no run, no worktree).
Heavy (one SmolLM2 demo, ~6-7 min on 2 cores): run it under the CPU lock (``flock /tmp/aj-cpu.lock``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentjet.apps.bench.report import record_from_demo
from agentjet.apps.bench.suite import LEARN_BUDGET_S, LearnSettings, demo_flags, learn_demo
from agentjet.models import DEFAULT_MODEL
from agentjet.observe.bench_records import BenchRecord, append_history
from agentjet.runtime.provenance import device, machine
from agentjet.tasks import DEFAULT_TASK

ROOT = Path(__file__).resolve().parents[2]


def supported(flags: dict[str, str | None], help_text: str) -> tuple[dict[str, str | None], list[str]]:
    """The flags the demo's ``--help`` lists, and the names of those it lacks."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", help_text)  # rich may colour the help
    have = {f for f in flags if re.search(re.escape(f) + r"(?![\w-])", plain)}
    return {f: v for f, v in flags.items() if f in have}, [f for f in flags if f not in have]


def command(flags: dict[str, str | None]) -> list[str]:
    args: list[str] = []
    for flag, value in flags.items():
        args += [flag] if value is None else [flag, value]
    return args


def backfill_record(data: dict[str, Any], commit: str, settings: LearnSettings, used: dict[str, str | None],
                    missing: list[str], how: str) -> BenchRecord:
    """The history record of a past commit's demo result, marked backfilled, with how it was made."""
    note = (f"backfilled: {how}; ajet demo {' '.join(command(used))}"
            + (f"; this demo has no {', '.join(missing)} (ran without)" if missing else ""))
    record = record_from_demo(data, commit=commit, machine=machine(), device=device(),
                              date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), backfilled=True, notes=note)
    return record.model_copy(update={"settings": {
        **record.settings, "bench": {**settings.recorded(), "flags_used": command(used), "flags_missing": missing}}})


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def run_commit(commit: str, settings: LearnSettings, log: Path | None) -> tuple[dict[str, Any], dict[str, str | None],
                                                                                 list[str]]:
    with tempfile.TemporaryDirectory(prefix=f"aj-backfill-{commit[:7]}-") as tmp:
        tree = Path(tmp) / "tree"
        git("worktree", "add", "--detach", str(tree), commit)
        try:
            env = {**os.environ, "PYTHONPATH": str(tree / "src")}
            base = [sys.executable, "-m", "agentjet.cli", "demo"]
            help_text = subprocess.run([*base, "--help"], cwd=tree, env={**env, "COLUMNS": "200"}, check=True,
                                       capture_output=True, text=True).stdout
            used, missing = supported(demo_flags(settings), help_text)
            out = Path(tmp) / "out"
            args = [*base, *command(used), "--out-dir", str(out)]
            print("running", " ".join(args), flush=True)
            with (log.open("a") if log else open(os.devnull, "w")) as sink:
                demo = subprocess.Popen(args, cwd=tree, env=env, stdout=sink, stderr=subprocess.STDOUT)
                try:
                    if demo.wait() != 0:
                        raise SystemExit(f"the demo at {commit[:10]} exited {demo.returncode} (log: {log})")
                except BaseException:
                    stop(demo)
                    raise
            data = json.loads((out / "demo_result.json").read_text())
        finally:
            git("worktree", "remove", "--force", str(tree))
    return data, used, missing


def stop(demo: subprocess.Popen[bytes]) -> None:
    """Stop a demo as Ctrl-C would (it then stops its server), or kill it after a minute."""
    if demo.poll() is None:
        demo.send_signal(signal.SIGINT)
        try:
            demo.wait(60)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (a deadline's timeout): stop the demo and remove the worktree


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("commit")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget-min", type=float, default=LEARN_BUDGET_S / 60)
    ap.add_argument("--task", default=DEFAULT_TASK)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--history", type=Path, default=ROOT / "benchmarks" / "bench_history.jsonl")
    ap.add_argument("--log", type=Path, default=None, help="append the demo's output here")
    ap.add_argument("--from-json", type=Path, default=None, help="convert this demo result; run nothing")
    a = ap.parse_args()
    commit = git("rev-parse", f"{a.commit}^{{commit}}")
    settings = LearnSettings(demo=learn_demo(task=a.task, model=a.model, seed=a.seed,
                                             run={"time_budget_s": 60 * a.budget_min}), commit=commit)
    if a.from_json:
        data = json.loads(a.from_json.read_text())
        record = backfill_record(data, commit, settings, {}, [], f"converted from {a.from_json} (a run made before)")
    else:
        data, used, missing = run_commit(commit, settings, a.log)
        record = backfill_record(data, commit, settings, used, missing, "this commit's own ajet demo, run in a git "
                                 f"worktree with PYTHONPATH=<worktree>/src and {sys.executable}")
    append_history(a.history, record)
    figures = {k: round(m.value, 3) for k, m in record.metrics.items()}
    print(f"appended {commit[:10]} (seed {a.seed}) to {a.history}: {figures}")


if __name__ == "__main__":
    main()
