"""Issue 51's measurements, back to back under the shared CPU lock, resumable after an interruption.

    .venv/bin/python benchmarks/learning/wave51.py --list          # the jobs, their commands and hours
    .venv/bin/python benchmarks/learning/wave51.py                 # run every job not done yet (about 13 h)
    .venv/bin/python benchmarks/learning/wave51.py --only a-chain_sum b-addition
    .venv/bin/python benchmarks/learning/wave51.py --summarize     # only the 3-seed summaries and rule (b) of what is done

The verdict rules these runs are read by are written in docs/benchmarks.md ("Issue 51: the plan and its rules,
written before any run"). Each job is one command, run in its own process while this script holds the CPU lock
(``/tmp/aj-cpu.lock``, ``flock`` as every heavy benchmark here takes it; it is released between jobs):

- ``a-*``: ``vs_trl.py --task rg:...`` against TRL, 15 min a side, seeds 0-2 (``--resume``: a cut-short job
  keeps its finished runs);
- ``b-*``: ``vs_trl.py --sides agentjet --arms as-is levels``, the levels against retirement alone, 15 min, seeds
  0-2 (``--resume``); the results file has ``levels`` in its name;
- ``c-*``: ``ajet demo --levels`` on a reasoning-gym dataset at its default knobs, 6 min of training, one job a
  seed;
- ``d-*``: ``ajet demo`` for the last wave's single-seed learning results, one job a seed, with the commands
  those results were measured with.

A job is done when its results file is there (a ``vs_trl.py`` file also says ``complete``); a demo job that was
cut short starts again from nothing. Every JSON records its commit and machine (the scripts' provenance); the
demo jobs' JSON and PNG are copied to ``benchmarks/results/`` and each 3-seed group is summarised there
(``*_3seeds.json``: mean and standard error of each figure).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
RUNS = ROOT / "runs" / "wave51"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # vs_trl.py, its sibling (imported where it is used)
LOCK = Path("/tmp/aj-cpu.lock")
PY = sys.executable
SEEDS = (0, 1, 2)

CHAIN_SUM = "rg:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1"  # the knobs of the last wave
PRODUCTS = "rg:products:min_digits=1,max_digits=1"
COCKTAIL = (f"{CHAIN_SUM}+products:min_digits=1,max_digits=1+spell_backward:min_word_len=3,max_word_len=3")
GUESS_WIN = "ta:GuessTheNumber-v0:reward=win"


@dataclass(frozen=True)
class Job:
    name: str
    cmd: list[str]
    out: Path  # the results file that says the job is done
    hours: float  # the estimate, on the 2-core box
    demo_dir: Path | None = None  # a demo job: its out dir (its JSON and PNG are copied to ``out``)
    group: str = ""  # a 3-seed group summarised together
    extra: dict[str, Any] = field(default_factory=dict)

    def done(self) -> bool:
        if not self.out.exists():
            return False
        if self.demo_dir is not None:
            return True
        data = json.loads(self.out.read_text())
        return bool(data.get("complete")) and set(SEEDS) <= {r["seed"] for r in data.get("runs", [])}


def vs_trl(*args: str) -> list[str]:
    return [PY, str(ROOT / "benchmarks" / "learning" / "vs_trl.py"), *args, "--budget-min", "15", "--seeds",
            *map(str, SEEDS), "--resume"]


def demo(task: str, seed: int, out_dir: Path, *flags: str) -> list[str]:
    return [PY, "-m", "agentjet.cli", "demo", "--task", task, "--no-early-stop", "--steps", "1000", "--seed",
            str(seed), "--out-dir", str(out_dir), *flags]


def jobs() -> list[Job]:
    out = [
        Job("a-chain_sum", vs_trl("--task", CHAIN_SUM, "--out", str(RESULTS / "rg" / "vs_trl_chain_sum_15min.json")),
            RESULTS / "rg" / "vs_trl_chain_sum_15min.json", 2.3),
        Job("a-products", vs_trl("--task", PRODUCTS, "--out", str(RESULTS / "rg" / "vs_trl_products_15min.json")),
            RESULTS / "rg" / "vs_trl_products_15min.json", 2.3),
        Job("b-addition", vs_trl("--task", "addition", "--sides", "agentjet", "--arms", "as-is", "levels",
                                 "--score-levels", "4", "--out", str(RESULTS / "levels_addition_15min.json")),
            RESULTS / "levels_addition_15min.json", 2.1),
        Job("b-chain_sum", vs_trl("--task", CHAIN_SUM, "--sides", "agentjet", "--arms", "as-is", "levels",
                                  "--score-levels", "3", "--out", str(RESULTS / "rg" / "levels_chain_sum_15min.json")),
            RESULTS / "rg" / "levels_chain_sum_15min.json", 2.4),
    ]
    demos = [  # (group, task, flags, hours a seed): c, issue 51's new datasets with levels; d, last wave's rows
        ("c-levels_gcd", "rg:gcd", ["--levels", "--time-budget-s", "360", "--eval-every-s", "120"], 0.2),
        ("c-levels_letter_counting", "rg:letter_counting",
         ["--levels", "--time-budget-s", "360", "--eval-every-s", "120"], 0.2),
        ("d-chain_sum", CHAIN_SUM, ["--time-budget-s", "480", "--eval-every-s", "240"], 0.2),
        ("d-products", PRODUCTS, ["--time-budget-s", "600", "--eval-every-s", "300"], 0.25),
        ("d-cocktail", COCKTAIL, ["--batch-groups", "3", "--concurrency", "48", "--time-budget-s", "540",
                                  "--eval-every-s", "240"], 0.25),
        ("d-guess_win", GUESS_WIN, ["--time-budget-s", "480", "--eval-every-s", "240"], 0.35),
    ]
    for group, task, flags, hours in demos:
        name = group.split("-", 1)[1]
        where = RESULTS / ("rg" if task.startswith("rg:") else "") / "seeds"
        for seed in SEEDS:
            run_dir = RUNS / f"{name}_seed{seed}"
            out.append(Job(f"{group}-seed{seed}", demo(task, seed, run_dir, *flags), where / f"{name}_seed{seed}.json",
                           hours, demo_dir=run_dir, group=group, extra={"task": task, "seed": seed}))
    return out


# ---------------------------------------------------------------------------- running


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def run(job: Job, log: Path) -> int:
    """``job`` under the CPU lock, its output appended to ``log``; a demo job's JSON and PNG copied to its place."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("a") as lock, log.open("a") as out:
        print(f"== {job.name}: waiting for the CPU lock {LOCK} ...", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        print(f"== {job.name}: started {start} (load average {load_average()})\n   {' '.join(job.cmd)}", flush=True)
        out.write(f"\n== {job.name} {start} load {load_average()}\n{' '.join(job.cmd)}\n")
        out.flush()
        if job.demo_dir is not None:
            shutil.rmtree(job.demo_dir, ignore_errors=True)  # a demo cut short starts again from nothing
        code = subprocess.run(job.cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode
        end = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        out.write(f"== {job.name} ended {end}, exit {code}, load {load_average()}\n")
    if code == 0 and job.demo_dir is not None:
        result = json.loads((job.demo_dir / "demo_result.json").read_text())
        result["wave51"] = {"job": job.name, "command": " ".join(job.cmd), "started": start, "ended": end}
        job.out.parent.mkdir(parents=True, exist_ok=True)
        job.out.write_text(json.dumps(result, indent=2, default=str))
        if (job.demo_dir / "reward_curve.png").exists():
            shutil.copy(job.demo_dir / "reward_curve.png", job.out.with_suffix(".png"))
    print(f"== {job.name}: exit {code} at {end}", flush=True)
    return code


# ---------------------------------------------------------------------------- 3-seed summaries


def mean_se(values: list[float]) -> dict[str, float | None]:
    return {"mean": statistics.mean(values) if values else None,
            "se": statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else None, "n": len(values)}


def rule_d(rise: dict[str, float | None]) -> str:
    """Issue 51's rule (d): a result holds when its three-seed mean rise is more than two standard errors above 0."""
    mean, se = rise["mean"], rise["se"]
    return "holds" if mean is not None and se is not None and mean > 2 * se else "not shown"


def demo_figures(result: dict[str, Any]) -> dict[str, float]:
    """One demo run's figures: held-out before and after and the rise (the task as named); per task type for a
    cocktail; with levels, the highest level reached and the last eval at the level trained."""
    out = {"before": result["eval_before"], "after": result["eval_after"],
           "rise": result["eval_after"] - result["eval_before"], "train_steps": result["train_steps"]}
    by_type = result.get("eval_by_type") or []
    if by_type and len(by_type[0]["rewards"]) > 1:
        for t in by_type[0]["rewards"]:
            out[f"{t}_before"], out[f"{t}_after"] = by_type[0]["rewards"][t], by_type[-1]["rewards"][t]
            out[f"{t}_rise"] = by_type[-1]["rewards"][t] - by_type[0]["rewards"][t]
    levels = result.get("levels") or {}
    if levels:
        out["highest_level"] = max(levels["highest"].values())
        last = result["evals"][-1]
        for t, r in last.get("level_rewards", {}).items():
            out[f"{t}_at_level_{last['levels'][t]}_after"] = r
    return out


def summarize(all_jobs: list[Job]) -> list[Path]:
    """``<group>_3seeds.json`` for each demo group whose seeds are all done."""
    written = []
    for group in dict.fromkeys(j.group for j in all_jobs if j.group):
        members = [j for j in all_jobs if j.group == group]
        if not all(j.done() for j in members):
            continue
        results = [json.loads(j.out.read_text()) for j in members]
        figures = [demo_figures(r) for r in results]
        keys = [k for k in figures[0] if all(k in f for f in figures)]
        summary = {"group": group, "task": members[0].extra["task"], "seeds": [j.extra["seed"] for j in members],
                   "commands": [r.get("wave51", {}).get("command", " ".join(j.cmd))  # as each was run
                                for r, j in zip(results, members, strict=True)],
                   "provenance": [r.get("provenance", {}) for r in results],
                   "by_seed": figures, "summary": {k: mean_se([float(f[k]) for f in figures]) for k in keys}}
        if group.startswith("d-"):  # the plan's rule (d), docs/benchmarks.md; (c) is stated, not judged
            summary["verdict"] = rule_d(summary["summary"]["rise"])
        path = members[0].out.with_name(group.split("-", 1)[1] + "_3seeds.json")
        path.write_text(json.dumps(summary, indent=2))
        written.append(path)
        s = summary["summary"]
        print(f"{group}: held-out {s['before']['mean']:.3f} -> {s['after']['mean']:.3f} (rise {s['rise']['mean']:+.3f}"
              f" ± {s['rise']['se'] or 0:.3f} SE over {len(members)} seeds) -> {path}")
    return written


def judge_levels(all_jobs: list[Job]) -> list[Path]:
    """Rule (b) on each finished ``b-*`` file: ``summary.levels_checks`` (``vs_trl.levels_checks``), written into the
    file when a run of an older ``vs_trl.py`` left it out; the figures it reads are the file's own."""
    from vs_trl import levels_checks

    written = []
    for job in (j for j in all_jobs if j.name.startswith("b-") and j.done()):
        data = json.loads(job.out.read_text())
        checks = levels_checks(data["summary"], data["runs"])
        if checks is None:
            continue
        if data["summary"].get("levels_checks") != checks:
            data["summary"]["levels_checks"] = checks
            job.out.write_text(json.dumps(data, indent=2, default=str))
            written.append(job.out)
        clauses = ", ".join(f"{k} {'ok' if checks[k]['ok'] else 'FAILS'}" for k in
                            ("signal", "steps", "no_forgetting", "progress"))
        print(f"{job.name}: levels {'WIN' if checks['win'] else 'do not win'} ({clauses}) -> {job.out}")
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", action="store_true", help="print the jobs, their commands, state and hours; run none")
    p.add_argument("--only", nargs="+", default=None, help="job names (or prefixes: a-, b-, c-levels_gcd ...)")
    p.add_argument("--summarize", action="store_true", help="only write the 3-seed summaries of what is done")
    p.add_argument("--log", type=Path, default=RUNS / "wave51.log", help="every job's output, appended")
    args = p.parse_args()
    all_jobs = jobs()
    chosen = [j for j in all_jobs if args.only is None or any(j.name.startswith(o) for o in args.only)]
    if args.list:
        for j in chosen:
            print(f"{j.name:32s} {'done' if j.done() else 'todo':4s} ~{j.hours:.2f} h  {' '.join(j.cmd)}")
        todo = sum(j.hours for j in chosen if not j.done())
        print(f"{len(chosen)} jobs, {sum(not j.done() for j in chosen)} to run: about {todo:.1f} h of the machine")
        return
    if not args.summarize:
        for j in chosen:
            if j.done():
                print(f"== {j.name}: done ({j.out.relative_to(ROOT)})", flush=True)
                continue
            if run(j, args.log) != 0:
                print(f"== {j.name} failed: see {args.log}; the jobs after it still run", flush=True)
    summarize(all_jobs)
    judge_levels(all_jobs)


if __name__ == "__main__":
    main()
