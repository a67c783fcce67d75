"""AgentJet vs TRL's GRPOTrainer on a single-turn task, by wall clock, on this CPU.

    .venv/bin/python benchmarks/learning/vs_trl.py                       # addition, 20 min each, seeds 0 and 1
    .venv/bin/python benchmarks/learning/vs_trl.py --budget-min 10       # shorter
    .venv/bin/python benchmarks/learning/vs_trl.py --task rg:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1
    .venv/bin/python benchmarks/learning/vs_trl.py --quick               # plumbing check on the tiny model (~3 min)

``--task`` is any single-turn task name (``agentjet.tasks.get_task``): the demo's ``addition`` (the default) or a
reasoning-gym dataset ``rg:NAME[:knobs]`` with its own scorer. Both sides train SmolLM2-135M-Instruct
(``agentjet.models.resolve_model``) on the same train prompts (the task's messages through the model's chat
template: for ``rg:`` its answer-format system prompt and two worked examples), the same reward function (the
task's ``reward``), 8 generations per prompt and 4 prompts per step, lr 2e-5 constant, AdamW, no KL, the task's
max new tokens and temperature (addition: 10 tokens, rg: 48; T = 0.7), fp32, the same 2 CPU threads. One after
the other in this script (each in its own subprocess), with the same training-time budget. At fixed
training-clock points each side saves its weights (the clock stops while it saves); after the run every
checkpoint is scored by ONE evaluator (``evaluate_checkpoint``: the task's held-out split, ``--eval-n`` episodes
(default: the task's, 44 for addition, 50 a reasoning-gym dataset), its eval sampling with fixed per-task
seeds). The target is 0.75 held-out on addition and 0.5 on any other task (``--target``). Each results JSON
names its ``task``. Results: benchmarks/results/vs_trl.json and vs_trl.png (``--out``).

**Difficulty levels** (``--arms levels``, AgentJet only; docs/benchmarks.md, "Difficulty levels against retirement
alone"): the ``levels`` arm trains with ``agentjet.schedule.LevelledTasks`` (each level's own retirement); every
checkpoint is also scored at the level being trained then (``eval_level``), and each run's last checkpoint at
each level above the start up to ``--score-levels`` (``final_by_level``), so both arms can be read at the highest
level the levels arm reached. At each checkpoint pause the server's counters are recorded (``train_steps``,
``uniform`` and ``done`` episodes), so the uniform share and the train steps after minute 5 can be read off.

AgentJet runs as the demo does (``ajet demo``'s server and scheduled client: concurrency 32, curriculum,
uniform groups skipped); TRL as fast as its docs allow for this model on this CPU: ``GRPOConfig`` defaults except
``TRL_OVERRIDES`` (each with its reason: gradient checkpointing off, fp32 as AgentJet, the shared settings). The
results record TRL's whole resolved config (``trl_config``, ``gradient_checkpointing`` included) and, per run,
whether the trained model really had gradient checkpointing on and its dtype.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentjet.runtime.omp import prefer_passive_openmp
from agentjet.runtime.provenance import git_commit

prefer_passive_openmp()  # before torch loads, for both sides (the server does the same)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_TASK = "addition"
TARGET = 0.75  # addition's target; another task's is OTHER_TARGET (the 0.5 on reasoning-gym)
OTHER_TARGET = 0.5
EVAL_POINTS_MIN = (1, 2, 3, 4, 5, 7.5, 10, 12.5, 15, 17.5, 20, 25, 30)

# The settings both sides share (the task's sampling replaces max_tokens, temperature, top_p: ``shared_for``).
SHARED = {"learning_rate": 2e-5, "num_generations": 8, "prompts_per_step": 4, "max_tokens": 10,
          "temperature": 0.7, "top_p": 1.0}


def target_for(task: str) -> float:
    return TARGET if task == DEFAULT_TASK else OTHER_TARGET


def shared_for(task_mod: Any) -> dict[str, Any]:
    """``SHARED`` with the task's own sampling (max new tokens, temperature, top-p)."""
    sampling = task_mod.SAMPLING
    return {**SHARED, "max_tokens": sampling["max_tokens"], "temperature": sampling.get("temperature", 1.0),
            "top_p": sampling.get("top_p", 1.0)}


# The plateau ablation (issue 38; docs/benchmarks.md, "The plateau ablation"): AgentJet arms that each change one
# suspected cause of the late plateau, run with `--sides agentjet --arms ...`. "as-is" is the demo's behaviour.
@dataclass(frozen=True)
class Arm:
    why: str
    curriculum: bool = True
    levels: bool = False  # difficulty levels (agentjet.schedule.LevelledTasks), retirement within each level
    revisit: float | None = None  # the curriculum's chance to revisit a solved task (None: its default, 0.05)
    config: dict[str, dict[str, Any]] = field(default_factory=dict)  # live settings set at the start
    lr_end: float | None = None  # the learning rate decays linearly to this by the end of the budget


ARMS: dict[str, Arm] = {
    "as-is": Arm("the demo as it is: curriculum (solved tasks revisited 5 %), uniform groups skipped, constant "
                 "learning rate, no KL"),
    "revisit-0.3": Arm("solved tasks stay in the mix: the curriculum revisits them 30 % of the time", revisit=0.3),
    "no-curriculum": Arm("no curriculum: the pool is cycled in order, solved or not", curriculum=False),
    "keep-uniform": Arm("uniform groups are trained on (zero advantage: they only dilute the step)",
                        config={"training": {"drop_uniform_groups": False}}),
    "lr-decay": Arm("the learning rate decays linearly to a tenth by the end (set at each checkpoint pause)",
                    lr_end=SHARED["learning_rate"] / 10),
    "kl-0.05": Arm("a k3 KL penalty to the initial weights, coefficient 0.05", config={"loss": {"kl_coef": 0.05}}),
    # rule 3: no arm passed the screen, so the closest ones (within 0.015 of the best late mean) are combined
    "combined": Arm("the screen's closest arms together: KL 0.05, no curriculum, the rate decaying to a tenth",
                    curriculum=False, config={"loss": {"kl_coef": 0.05}}, lr_end=SHARED["learning_rate"] / 10),
    # issue 51: harder tasks once the easy ones are solved, instead of starving on them
    "levels": Arm("difficulty levels: a level rises when its groups are mostly solved and falls back when they "
                  "fail; retirement of solved tasks within each level (the task's level settings)", levels=True),
}


def side_label(side: str, arm: str) -> str:
    """A run's label in the results: ``agentjet`` for the demo as it is, ``agentjet:<arm>`` for an ablation arm."""
    return side if side != "agentjet" or arm == "as-is" else f"agentjet:{arm}"


# Every GRPOConfig setting that differs from TRL 1.16's default, with the reason. Sources: the GRPOConfig and
# _BaseConfig docstrings in trl 1.16.0 (trl/trainer/grpo_config.py, trl/trainer/base_config.py) and TRL's
# "Speeding Up Training" and "Reducing Memory Usage" pages (https://huggingface.co/docs/trl/speeding_up_training,
# https://huggingface.co/docs/trl/reducing_memory_usage). Written out in docs/benchmarks.md.
def trl_overrides(shared: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """``TRL_OVERRIDES`` for the settings both sides share (a task's own max tokens and temperature)."""
    return {**TRL_OVERRIDES, **{k: (shared[key], why) for k, key, why in (
        ("max_completion_length", "max_tokens", "shared: the task's max tokens (TRL's default is 512)"),
        ("temperature", "temperature", "shared sampling temperature (TRL's default is 1.0)"),
        ("top_p", "top_p", "shared (also TRL's default)"))}}


TRL_OVERRIDES: dict[str, tuple[Any, str]] = {
    # speed
    "gradient_checkpointing": (False, "TRL defaults it to True to save memory at '~20% slower training' (its "
                               "docs); a 135M model's activations for 32 x ~55 tokens are a few MB, so there is "
                               "nothing to save and the recomputation is pure cost (transformers 5 resolves it "
                               "into activation_checkpointing, recorded too)"),
    "use_cpu": (True, "this machine has no accelerator"),
    # the same precision as AgentJet
    "bf16": (False, "TRL defaults to bf16 mixed precision; AgentJet trains in fp32 on CPU, so both run fp32"),
    "model_init_kwargs": ({"dtype": "float32"}, "load the weights in fp32 explicitly (AgentJet's CPU dtype), "
                          "whatever dtype the checkpoint was saved in"),
    # the same algorithm settings as AgentJet (SHARED)
    "learning_rate": (SHARED["learning_rate"], "shared (TRL's default is 1e-6)"),
    "lr_scheduler_type": ("constant", "the default 'linear' decays towards max_steps, which a time budget never "
                          "reaches; AgentJet's rate is constant"),
    "per_device_train_batch_size": (SHARED["num_generations"] * SHARED["prompts_per_step"],
                                    "4 prompts x 8 generations per step, as AgentJet's 4 groups of 8"),
    "num_generations": (SHARED["num_generations"], "shared (also TRL's default)"),
    "max_completion_length": (SHARED["max_tokens"], "shared: the task's max tokens (TRL's default is 512)"),
    "temperature": (SHARED["temperature"], "shared sampling temperature (TRL's default is 1.0)"),
    "top_p": (SHARED["top_p"], "shared (also TRL's default)"),
    "beta": (0.0, "no KL term, as AgentJet (also TRL's default)"),
    # bookkeeping: the time budget ends the run; the benchmark saves its own checkpoints
    "max_steps": (100_000, "a ceiling the time budget never reaches (the callback stops training)"),
    "logging_steps": (1, "log every step"),
    "save_strategy": ("no", "the benchmark's callback saves the checkpoints to evaluate, off the training clock"),
    "report_to": ("none", "no experiment tracker (also the default with transformers 5)"),
    "disable_tqdm": (True, "no progress bar"),
}


def trl_config(out_dir: str, seed: int, shared: dict[str, Any] | None = None) -> dict[str, Any]:
    """GRPOConfig arguments: TRL's defaults (loss "dapo", rewards scaled per group, epsilon 0.2, one iteration per
    batch, AdamW, max_grad_norm 1.0, one generation batch per optimizer step) with ``TRL_OVERRIDES`` (for the
    task's ``shared`` settings)."""
    overrides = trl_overrides(shared) if shared is not None else TRL_OVERRIDES
    return {"output_dir": out_dir, "seed": seed, **{k: v for k, (v, _) in overrides.items()}}


def trl_full_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Every GRPOConfig field as TRL resolves it (``gradient_checkpointing`` and ``bf16`` included)."""
    from trl import GRPOConfig

    full = GRPOConfig(**cfg).to_dict()
    return {k: v for k, v in full.items() if k not in ("output_dir", "logging_dir", "hub_token")}


# ---------------------------------------------------------------------------- the one evaluator
def evaluate_checkpoint(path: str, tasks: list[dict[str, Any]], task: str = DEFAULT_TASK,
                        more: dict[str, list[dict[str, Any]]] | None = None) -> float | dict[str, float]:
    """Mean reward of the weights in ``path`` on ``tasks`` with the task's EVAL_SAMPLING (seed + index), scored by
    the task's reward (a task at a difficulty level by its level's). With ``more`` (named sets of tasks, e.g. a
    level's held-out tasks), one engine scores them all: ``{"eval": ..., name: ...}``."""
    from agentjet.engines.base import SamplingParams
    from agentjet.layouts import embedded_engine
    from agentjet.settings import GeneratorSettings
    from agentjet.tasks import LevelledSource, get_task, ladders

    named = get_task(task)
    source = LevelledSource(named, ladders(named))
    sets = {"eval": tasks, **(more or {})}
    engine = embedded_engine(path, GeneratorSettings(max_batch_size=max(len(ts) for ts in sets.values())))
    tok = engine.tokenizer
    ev = named.EVAL_SAMPLING

    async def score(ts: list[dict[str, Any]]) -> float:
        async def one(i: int, t: dict[str, Any]) -> float:
            ids = list(tok.apply_chat_template(t["messages"], add_generation_prompt=True, tokenize=True,
                                               return_dict=False))
            res = await engine.generate(ids, SamplingParams(temperature=ev["temperature"], top_p=ev["top_p"],
                                                            max_tokens=ev["max_tokens"], seed=ev["seed"] + i))
            return source.reward(t, res.text)

        out = await asyncio.gather(*(one(i, t) for i, t in enumerate(ts)))
        return sum(out) / len(out)

    async def go() -> dict[str, float]:
        try:
            return {name: await score(ts) for name, ts in sets.items() if ts}
        finally:
            await engine.close()

    scored = asyncio.run(go())
    return scored["eval"] if more is None else scored


def level_eval_tasks(task: str, level: int, n: int) -> list[dict[str, Any]]:
    """``n`` held-out tasks of the task's one task type at difficulty ``level``, tagged with it."""
    from agentjet.tasks import get_task, ladders

    (ladder,) = ladders(get_task(task)).values()
    return [{**t, "level": level} for t in ladder.at(level).generate_tasks("eval", n, seed=0)]


# ---------------------------------------------------------------------------- AgentJet side
def run_agentjet(model: str, seed: int, budget_s: float, points_s: list[float], ckpt_dir: Path,
                 arm: str = "as-is", task: str = DEFAULT_TASK) -> dict[str, Any]:
    import secrets
    import sqlite3

    from agentjet.apps.demo import DemoSettings, server_config, train_pool
    from agentjet.client.client import SwarmClient
    from agentjet.client.runner import task_workflow
    from agentjet.client.scheduled import run_scheduled
    from agentjet.client.settings import RunSettings
    from agentjet.protocol import SWARM_PREFIX
    from agentjet.runtime.launch import ServerProcess, free_port
    from agentjet.schedule import Curriculum, CurriculumSettings, LevelledTasks, LevelSettings
    from agentjet.tasks import LevelledSource, get_task, ladders

    a = ARMS[arm]
    task_mod = get_task(task)
    shared = shared_for(task_mod)

    work = Path(tempfile.mkdtemp(prefix="vs-trl-aj-"))
    s = DemoSettings(model=model, out_dir=work, run=RunSettings(concurrency=32))
    rec = task_mod.RECOMMENDED.model_copy(update={"learning_rate": shared["learning_rate"],
                                                  "group_size": shared["num_generations"],
                                                  "batch_groups": shared["prompts_per_step"]})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    token = secrets.token_urlsafe(32)  # the client pauses training and saves checkpoints (control API)
    server = ServerProcess("vs-trl", server_config(s, port, rec, token), work / "server.log",
                           work / "server.yaml").start()
    points: list[dict[str, Any]] = []
    task_ladders = ladders(task_mod) if a.levels else {}
    if a.levels and len(task_ladders) != 1:
        raise SystemExit(f"--arms levels needs a task with levels and one task type; {task} has {len(task_ladders)}")
    cur = CurriculumSettings(**({"revisit": a.revisit} if a.revisit is not None else {}))
    levels = (LevelledTasks(task_ladders, LevelSettings(**rec.levels), pool_n=rec.pool, seed=seed,
                            curriculum=cur if a.curriculum else None) if a.levels else None)
    source = LevelledSource(task_mod, task_ladders) if a.levels else task_mod
    try:
        server.wait_ready()
        sampling = dict(task_mod.SAMPLING)

        async def main() -> Any:
            pool = train_pool(task_mod) if levels is None else []
            async with SwarmClient(url, token=token, client_id="vs-trl") as client:
                if a.config:
                    await client.request("POST", f"{SWARM_PREFIX}/control/config", json=a.config)

                async def checkpoint(train_s: float) -> None:
                    if a.lr_end is not None:  # the rate for the stretch up to the next pause
                        lr0 = shared["learning_rate"]
                        lr = lr0 + (a.lr_end - lr0) * min(train_s / budget_s, 1.0)
                        await client.request("POST", f"{SWARM_PREFIX}/control/config",
                                             json={"learner": {"learning_rate": lr}})
                    r = await client.request("POST", f"{SWARM_PREFIX}/control/checkpoint")
                    dest = ckpt_dir / f"agentjet-{len(points):02d}"
                    await asyncio.to_thread(shutil.copytree, r["path"], dest,
                                            ignore=shutil.ignore_patterns("optimizer.pt"))
                    points.append({"train_s": train_s, "step": r["train_step"], "path": str(dest),
                                   **counters(await client.status()),
                                   **({"level": levels.levels()} if levels is not None else {})})

                curriculum = (Curriculum([str(t["task_id"]) for t in pool], cur, seed=seed)
                              if a.curriculum and levels is None else None)
                settings = RunSettings(group_size=shared["num_generations"], concurrency=s.run.concurrency,
                                       time_budget_s=budget_s, eval_every_s=None, eval_at_s=tuple(points_s))
                run = await run_scheduled(client, task_workflow(source, sampling, model="demo"),
                                          task_workflow(source, sampling, model="demo"),
                                          pool, [], settings, curriculum=curriculum, levels=levels,
                                          at_pause=checkpoint)
                st = await client.status()
                return run, st

        t0 = time.monotonic()
        run, st = asyncio.run(main())
        wall = time.monotonic() - t0
    finally:
        server.stop(grace=120)
    db = sqlite3.connect(work / "server" / "store.sqlite")
    trained = sum(json.loads(m).get("trained_tokens", 0) for (m,) in db.execute("SELECT metrics FROM steps"))
    db.close()
    shutil.rmtree(work, ignore_errors=True)
    return {"points": points, "train_s": run.train_seconds, "wall_s": wall, "steps": st.train_steps,
            "generated_tokens": st.throughput["generated_tokens"], "trained_tokens": trained,
            "episodes": run.train.episodes, "groups": run.groups, "uniform_groups": run.uniform_groups,
            "stop_reason": run.stop_reason, "arm": arm, "arm_why": a.why, "end": counters(st),
            **({"levels": run.levels} if run.levels else {})}


def counters(st: Any) -> dict[str, int]:
    """The server's counters at a checkpoint: train steps, episodes in uniform groups (dropped), and every episode
    done with (trained, dropped, pending) — so the uniform share and the steps after minute 5 can be read off."""
    b = st.buffer
    return {"train_steps": st.train_steps, "uniform": b.dropped_uniform_episodes,
            "done": b.dropped_uniform_episodes + b.trained_episodes + b.dropped_stale_episodes + b.pending_episodes}


# ---------------------------------------------------------------------------- TRL side
def run_trl(model: str, seed: int, budget_s: float, points_s: list[float], ckpt_dir: Path,
            task: str = DEFAULT_TASK) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentjet.apps.demo import train_pool
    from agentjet.tasks import get_task

    task_mod = get_task(task)
    counts = {"generated_tokens": 0, "completions": 0}
    pool = {str(t["task_id"]): t for t in train_pool(task_mod)}  # AgentJet's pool: the same train prompts

    def reward(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], key: list[str],
               **_: Any) -> list[float]:
        counts["generated_tokens"] += sum(len(c) for c in completion_ids)
        counts["completions"] += len(completions)
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(task_mod.reward(pool[k], t)) for t, k in zip(texts, key, strict=True)]

    # each train task's prompt and its key (the reward looks the task up: a reasoning-gym entry is not a column)
    rows = [{"prompt": t["messages"], "key": k} for k, t in pool.items()] * max(400 * 78 // len(pool), 40)
    work = tempfile.mkdtemp(prefix="vs-trl-trl-")
    cfg = trl_config(work, seed, shared_for(task_mod))
    points: list[dict[str, Any]] = []

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.start = 0.0
            self.paused = 0.0
            self.todo = sorted(points_s)

        def train_s(self) -> float:
            return time.monotonic() - self.start - self.paused

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.start = time.monotonic()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            now = self.train_s()
            if self.todo and now >= self.todo[0]:
                while self.todo and now >= self.todo[0]:
                    self.todo.pop(0)
                t0 = time.monotonic()
                dest = ckpt_dir / f"trl-{len(points):02d}"
                kw["model"].save_pretrained(dest, safe_serialization=True)
                kw["processing_class"].save_pretrained(dest)
                points.append({"train_s": now, "step": state.global_step, "path": str(dest)})
                self.paused += time.monotonic() - t0
            if now >= budget_s:
                control.should_training_stop = True

    clock = Clock()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(**cfg),
                          train_dataset=Dataset.from_list(rows), callbacks=[clock])
    t0 = time.monotonic()
    trainer.train()
    wall = time.monotonic() - t0
    shutil.rmtree(work, ignore_errors=True)
    steps = trainer.state.global_step
    return {"points": points, "train_s": clock.train_s(), "wall_s": wall, "steps": steps,
            "generated_tokens": counts["generated_tokens"], "trained_tokens": counts["generated_tokens"],
            "episodes": counts["completions"], "config": trl_full_config(cfg), "train_prompts": len(pool),
            "gradient_checkpointing": any(getattr(m, "gradient_checkpointing", False) for m in trainer.model.modules()),
            "model_dtype": str(next(trainer.model.parameters()).dtype)}


# ---------------------------------------------------------------------------- orchestration
def _side_main(args: argparse.Namespace) -> None:
    points = [float(x) for x in args.points.split(",") if x]
    if args.side == "agentjet":
        out = run_agentjet(args.model, args.seed, args.budget_s, points, Path(args.ckpt_dir), args.arm, args.task)
    else:
        out = run_trl(args.model, args.seed, args.budget_s, points, Path(args.ckpt_dir), args.task)
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))


def _eval_at(points: list[dict[str, Any]], minute: float) -> float | None:
    """The eval of the checkpoint taken at the pause point ``minute`` (the first step boundary after it)."""
    for p in points:
        if p.get("target_min") == minute:
            return p["eval"]
    return None


def run_curve(run: dict[str, Any], base: float | None = None, task: str = DEFAULT_TASK,
              target: float = TARGET) -> Any:
    """A run's checkpoint evals (``points`` in vs_trl.json: ``train_s``, ``step``, ``eval``) as one curve of
    eval points, led by the base model's eval at 0 when ``base`` is given."""
    from agentjet.observe.learncurve import EvalPoint, LearnCurve

    points = [EvalPoint(train_steps=int(p["step"]), policy_version=int(p["step"]), reward=float(p["eval"]),
                        train_seconds=float(p["train_s"]), seconds=None) for p in run["points"]]
    if base is not None:
        points.insert(0, EvalPoint(train_steps=0, policy_version=0, reward=base, train_seconds=0.0, seconds=None))
    return LearnCurve(task=task, points=points, target=target, source=f"vs_trl {run.get('side', '')}")


def _time_to(run: dict[str, Any], target: float) -> float | None:
    """Training minutes of the first checkpoint whose eval reaches ``target``."""
    return next((p.train_minutes for p in run_curve(run).points if p.reward >= target), None)


LATE_FROM_MIN = 5.0  # "late": the checkpoints from this training minute on (issue 38)


def late_evals(run: dict[str, Any]) -> list[float]:
    """A run's checkpoint evals from training minute ``LATE_FROM_MIN`` on, in order."""
    return [p["eval"] for p in run["points"] if p["train_s"] / 60 >= LATE_FROM_MIN - 1e-9]


def late_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Learning that holds, per run and averaged: the mean eval of the checkpoints from minute 5 on, and how far
    the last one sits below the best of them (the pre-registered rule in docs/benchmarks.md reads these)."""
    means, declines = [], []
    for r in runs:
        if late := late_evals(r):
            means.append(statistics.mean(late))
            declines.append(max(late) - late[-1])
    ok = len(means) == len(runs) and means
    return {"late_mean_eval": statistics.mean(means) if ok else None, "late_mean_eval_by_seed": means,
            "late_decline": statistics.mean(declines) if ok else None, "late_decline_by_seed": declines}


MAX_FALL_FROM_BEST = 0.06  # issue 38: no seed's eval may fall further than this below its best after minute 5
MAX_TIME_TO_TARGET_RATIO = 0.5  # issue 38: AgentJet reaches the target in at most half TRL's time


def fall_from_best(run: dict[str, Any]) -> float | None:
    """The largest drop of a run's eval below the best it had reached, over its checkpoints from minute 5 on
    (a drawdown: 0.955, 0.886, 0.955 is a fall of 0.069, although the last point is the best)."""
    late = late_evals(run)
    if not late:
        return None
    best, fall = late[0], 0.0
    for v in late:
        best = max(best, v)
        fall = max(fall, best - v)
    return fall


def standard_error(values: list[float]) -> float | None:
    """The standard error of the mean of ``values`` (None for fewer than two)."""
    return statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else None


def holding_checks(runs: list[dict[str, Any]], minutes: list[float], budget_min: float,
                   target: float = TARGET) -> dict[str, Any] | None:
    """Issue 38's three checks of AgentJet as-is against TRL over the same seeds: the time to the target at most
    half TRL's (a seed that never reaches it counts the whole budget: a bound in TRL's favour when it is TRL's);
    the mean eval over seeds at every checkpoint from minute 5 on at least TRL's; no AgentJet seed falling more
    than ``MAX_FALL_FROM_BEST`` below its best after minute 5. Each late point carries the standard error of each
    side's mean and says whether the margin is inside the standard error of the difference (issue 51)."""
    aj, trl = ([r for r in runs if r["side"] == side] for side in ("agentjet", "trl"))
    if not aj or not trl or {r["seed"] for r in aj} != {r["seed"] for r in trl}:
        return None

    def mean_time(rs: list[dict[str, Any]]) -> float:
        return statistics.mean(t if (t := _time_to(r, target)) is not None else budget_min for r in rs)

    ratio = mean_time(aj) / mean_time(trl)
    points: dict[str, dict[str, Any]] = {}
    for m in (m for m in minutes if m >= LATE_FROM_MIN):
        a, t = ([_eval_at(r["points"], m) for r in rs] for rs in (aj, trl))
        if None in a or None in t:
            continue
        ma, mt = statistics.mean(a), statistics.mean(t)  # type: ignore[arg-type]
        sa, st = standard_error(a), standard_error(t)  # type: ignore[arg-type]
        se_diff = (sa**2 + st**2) ** 0.5 if sa is not None and st is not None else None
        points[str(m)] = {"agentjet": ma, "trl": mt, "ok": ma >= mt - 1e-9, "se_agentjet": sa, "se_trl": st,
                          "margin": ma - mt, "inside_se": se_diff is not None and abs(ma - mt) <= se_diff}
    falls = [fall_from_best(r) for r in aj]
    checks = {
        "time_to_target_ratio": ratio, "time_to_target_ok": ratio <= MAX_TIME_TO_TARGET_RATIO,
        "late_points": points, "late_points_ok": bool(points) and all(p["ok"] for p in points.values()),
        "fall_from_best_by_seed": falls,
        "fall_ok": all(f is not None and f <= MAX_FALL_FROM_BEST + 1e-9 for f in falls),
    }
    checks["all_ok"] = checks["time_to_target_ok"] and checks["late_points_ok"] and checks["fall_ok"]
    return checks


# Issue 51's rule (b), written in docs/benchmarks.md before the runs: when the levels arm wins over retirement alone.
MAX_LEVELS_UNIFORM_SHARE = 0.50
MIN_LEVELS_STEPS_RATIO = 1.5
MAX_LEVELS_LATE_MEAN_DROP = 0.03
MIN_LEVELS_PROGRESS = 0.05


def levels_checks(summary: dict[str, Any], runs: list[dict[str, Any]], as_is: str = "agentjet",
                  levels: str = "agentjet:levels") -> dict[str, Any] | None:
    """Rule (b) over the seeds of both arms (None unless both are there): (1) signal: the levels arm's mean uniform
    share after minute 5 under 0.50 and under as-is's; (2) steps: its mean train steps after minute 5 at least 1.5x
    as-is's; (3) no forgetting: no levels seed falls more than 0.06 below its best at the starting level after
    minute 5, and its mean late eval there at least as-is's - 0.03; (4) progress: at L, the lowest of the levels
    seeds' highest levels (above the start), the mean of its last checkpoints at least as-is's at L + 0.05. A figure
    that is missing fails its rule, and says so."""
    a, lv = summary.get(as_is), summary.get(levels)
    if a is None or lv is None:
        return None
    out: dict[str, Any] = {}
    ua, ul = a["uniform_share_after_5"], lv["uniform_share_after_5"]
    out["signal"] = {"levels": ul, "as_is": ua, "ok": ul is not None and ua is not None
                     and ul < MAX_LEVELS_UNIFORM_SHARE and ul < ua}
    sa, sl = a["steps_after_5"], lv["steps_after_5"]
    out["steps"] = {"levels": sl, "as_is": sa, "ratio": sl / sa if sl is not None and sa else None}
    out["steps"]["ok"] = out["steps"]["ratio"] is not None and out["steps"]["ratio"] >= MIN_LEVELS_STEPS_RATIO
    falls, ma, ml = lv["fall_from_best_by_seed"], a["late_mean_eval"], lv["late_mean_eval"]
    out["no_forgetting"] = {"fall_from_best_by_seed": falls, "late_mean_levels": ml, "late_mean_as_is": ma,
                            "ok": bool(falls) and all(f is not None and f <= MAX_FALL_FROM_BEST + 1e-9 for f in falls)
                            and ml is not None and ma is not None and ml >= ma - MAX_LEVELS_LATE_MEAN_DROP - 1e-9}
    starts = {lad["start"] for r in runs if r.get("side") == levels and r.get("levels")
              for lad in r["levels"]["ladders"].values()}
    highest = lv["highest_level_by_seed"]
    level = min(highest) if highest and all(h is not None for h in highest) else None
    at_a, at_l = (s["final_by_level"].get(str(level)) if level is not None else None for s in (a, lv))
    out["progress"] = {"level": level, "start": min(starts) if starts else None, "levels": at_l, "as_is": at_a,
                       "ok": level is not None and starts != set() and level > min(starts) and at_l is not None
                       and at_a is not None and at_l >= at_a + MIN_LEVELS_PROGRESS - 1e-9}
    if level is not None and starts and level > min(starts) and at_l is None:
        out["progress"]["why"] = f"level {level} was not scored (--score-levels too small)"
    out["win"] = all(out[k]["ok"] for k in ("signal", "steps", "no_forgetting", "progress"))
    return out


def _after(run: dict[str, Any], key: str) -> int | None:
    """How much a server counter (``counters``) grew from the minute-5 checkpoint to the run's end."""
    late = [p for p in run["points"] if p["train_s"] / 60 >= LATE_FROM_MIN - 1e-9 and key in p]
    return run["end"][key] - late[0][key] if late and key in run.get("end", {}) else None


def level_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per seed and averaged: the uniform share and the train steps after minute 5 (the server's counters), the
    largest fall below its best at the starting level (the task as named), the levels reached, and the last
    checkpoint's held-out eval at each level above the start (``final_by_level``)."""
    shares, steps, highest = [], [], []
    for r in runs:
        done, uniform = _after(r, "done"), _after(r, "uniform")
        shares.append(uniform / done if done and uniform is not None else None)
        steps.append(_after(r, "train_steps"))
        highest.append(max(r["levels"]["highest"].values()) if r.get("levels") else None)
    levels = sorted({int(k) for r in runs for k in r.get("final_by_level", {})})
    final = {str(k): [r.get("final_by_level", {}).get(str(k)) for r in runs] for k in levels}

    def mean(xs: list[Any]) -> float | None:
        return statistics.mean(xs) if xs and all(x is not None for x in xs) else None

    return {"uniform_share_after_5_by_seed": shares, "uniform_share_after_5": mean(shares),
            "steps_after_5_by_seed": steps, "steps_after_5": mean(steps),
            "fall_from_best_by_seed": [fall_from_best(r) for r in runs], "highest_level_by_seed": highest,
            "final_by_level_by_seed": final, "final_by_level": {k: mean(v) for k, v in final.items()}}


def summarize(runs: list[dict[str, Any]], minutes: list[float], target: float = TARGET) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side in dict.fromkeys(r["side"] for r in runs):
        mine = [r for r in runs if r["side"] == side]
        if not mine:
            continue
        at, se = {}, {}
        for m in minutes:
            vals = [v for r in mine if (v := _eval_at(r["points"], m)) is not None]
            at[str(m)] = statistics.mean(vals) if len(vals) == len(mine) else None
            se[str(m)] = standard_error(vals) if len(vals) == len(mine) else None
        times = [_time_to(r, target) for r in mine]
        mins = [r["train_s"] / 60 for r in mine]
        out[side] = {
            "eval_at_min": at, "eval_se_at_min": se,
            "time_to_target_min": statistics.mean(times) if all(t is not None for t in times) else None,
            "time_to_target_by_seed": times,
            "steps_per_min": statistics.mean(r["steps"] / m for r, m in zip(mine, mins, strict=True)),
            "generated_tokens_per_min": statistics.mean(r["generated_tokens"] / m for r, m in zip(mine, mins, strict=True)),
            "trained_tokens_per_min": statistics.mean(r["trained_tokens"] / m for r, m in zip(mine, mins, strict=True)),
            **late_figures(mine), **level_figures(mine),
        }
    if "agentjet" in out and "trl" in out:
        a, t = out["agentjet"]["time_to_target_min"], out["trl"]["time_to_target_min"]
        out["time_to_target_ratio"] = a / t if a is not None and t else None
    return out


def plot(runs: list[dict[str, Any]], base: float, path: Path, title: str, target: float = TARGET,
         eval_n: int = 44) -> None:
    from agentjet.observe.curveplot import Line, Panel, plot_curves

    sides = list(dict.fromkeys(r["side"] for r in runs))
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray"]
    colors = {"agentjet": "tab:blue", "trl": "tab:orange"}
    for side in sides:
        colors.setdefault(side, next(c for c in palette if c not in colors.values()))
    arms = any(side.startswith("agentjet:") for side in sides)
    names = {"agentjet": "AgentJet as-is" if arms else "AgentJet", "trl": "TRL GRPOTrainer"}
    lines = [Line(run_curve(r, base, target=target), label=f"{names.get(r['side'], r['side'])} seed {r['seed']}",
                  style={"marker": "o", "color": colors[r["side"]], "alpha": 0.8,
                         "linestyle": ["-", "--", ":", "-."][r["seed"] % 4]}) for r in runs]
    plot_curves(Panel(lines, x="train_minutes", target=target, target_label=f"target {target}",
                      xlabel="training wall-clock minutes (checkpoint saves excluded)",
                      ylabel=f"held-out eval reward ({eval_n} episodes, T=0.7)", ylim=(0, 1.02), legend_fontsize=8),
                path, title, figsize=(8, 4.5), dpi=120)


def _resumed(args: argparse.Namespace) -> tuple[list[dict[str, Any]], float | None]:
    """The runs and base eval already in ``args.out``, when it measured the same thing (else none: start over)."""
    if not args.out.exists():
        return [], None
    prev = json.loads(args.out.read_text())
    task = getattr(args, "task", DEFAULT_TASK)
    same = {k: prev.get(k) for k in ("model", "budget_min", "eval_n")} == {
        "model": args.model, "budget_min": args.budget_min, "eval_n": args.eval_n} and prev.get(
        "task", DEFAULT_TASK) == task  # files from before --task measured addition
    if not same:
        raise SystemExit(f"--resume: {args.out} measured model {prev.get('model')}, {prev.get('budget_min')} min, "
                         f"{prev.get('eval_n')} eval episodes on {prev.get('task', DEFAULT_TASK)}; this run asks for "
                         f"{args.model}, {args.budget_min} min, {args.eval_n} on {task}: give another --out")
    return prev["runs"], prev["base_eval"]


def save(args: argparse.Namespace, runs: list[dict[str, Any]], minutes: list[float], base: float,
         complete: bool, commit: str) -> dict[str, Any]:
    """Write the JSON and the figure (after every run, so a cut-short session keeps what finished). ``commit`` is
    the checkout's when the job began: read again here, it would say ``-dirty`` because of this very file."""
    summary = summarize(runs, [m for m in (5, 10, 20) if m <= args.budget_min] or minutes, args.target)
    summary["eval_at_every_point"] = summarize(runs, minutes, args.target)  # every point, with its standard error
    summary["holding_checks"] = holding_checks(runs, minutes, args.budget_min, args.target)
    summary["levels_checks"] = levels_checks(summary, runs)
    import torch
    import transformers

    with_trl = "trl" in args.sides  # an AgentJet-only run (the plateau ablation) needs no TRL installed
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    if with_trl:
        versions["trl"] = importlib.metadata.version("trl")
    result = {"machine": platform.machine(), "cpus": os.cpu_count(), "device": "cpu", "commit": commit,
              "torch_threads": torch.get_num_threads(), "versions": versions,
              "task": args.task, "model": args.model, "budget_min": args.budget_min, "seeds": sorted({r["seed"] for r in runs} | set(args.seeds)), "eval_n": args.eval_n,
              "eval_points_min": minutes, "base_eval": base, "target": args.target, "shared": args.shared,
              "trl_overrides": {k: {"value": v, "reason": why} for k, (v, why) in trl_overrides(args.shared).items()},
              "trl_config": trl_full_config(trl_config(tempfile.mkdtemp(prefix="vs-trl-cfg-"), 0, args.shared))
              if with_trl else None, "score_levels": args.score_levels,
              "arms": {a: ARMS[a].why for a in dict.fromkeys([*(r["arm"] for r in runs if r.get("arm")),
                                                                *(args.arms if "agentjet" in args.sides else [])])},
              "late_from_min": LATE_FROM_MIN, "runs": runs, "summary": summary, "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    what = "AgentJet vs TRL GRPOTrainer" if with_trl else "AgentJet's arms"
    plot(runs, base, args.out.with_suffix(".png"), f"{args.model} on {args.task}: {what} (CPU)", args.target,
         args.eval_n)
    result["complete"] = complete
    args.out.write_text(json.dumps(result, indent=2, default=str))
    return summary


def default_out(task: str, arms: list[str], sides: list[str]) -> Path:
    """``vs_trl.json`` for addition as before; another task's file names it, and a file with the levels arm says
    ``levels``."""
    name = "vs_trl" if task == DEFAULT_TASK else "vs_trl_" + "".join(c if c.isalnum() else "_" for c in
                                                                      task.removeprefix("rg:")).strip("_")
    return RESULTS / f"{name}{'_levels' if 'levels' in arms and 'agentjet' in sides else ''}.json"


def score_run(r: dict[str, Any], task: str, eval_tasks: list[dict[str, Any]], minutes: list[float],
              score_levels: list[int], named_level: int | None) -> None:
    """Score each checkpoint of a run with the one evaluator: the task as named (``eval``); with levels, also at
    the level being trained then (``eval_level``, when it is not the named one); and the last checkpoint at each
    of ``score_levels`` (``final_by_level``)."""
    for i, pt in enumerate(r["points"]):
        pt["target_min"] = minutes[i] if i < len(minutes) else None
        level = next(iter(pt["level"].values())) if pt.get("level") else None
        more = {}
        if level is not None and level != named_level:
            more["level"] = level_eval_tasks(task, level, len(eval_tasks))
        last = i == len(r["points"]) - 1
        if last:
            more.update({f"L{k}": level_eval_tasks(task, k, len(eval_tasks)) for k in score_levels})
        scored = evaluate_checkpoint(pt.pop("path"), eval_tasks, task, more)
        if isinstance(scored, dict):
            pt["eval"] = scored["eval"]
            if level is not None:
                pt["eval_level"] = scored.get("level", scored["eval"])
            if last and score_levels:
                r["final_by_level"] = {str(k): scored[f"L{k}"] for k in score_levels}
        else:
            pt["eval"] = scored
        at = f"  level {level} {pt['eval_level']:.3f}" if "eval_level" in pt else ""
        print(f"   {pt['train_s'] / 60:5.2f} min  step {pt['step']:3d}  eval {pt['eval']:.3f}{at}", flush=True)
    if "final_by_level" in r:
        print("   last checkpoint by level: " + ", ".join(f"{k} {v:.3f}" for k, v in r["final_by_level"].items()),
              flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default=DEFAULT_TASK, help="a single-turn task: addition or rg:NAME[:knobs] (both sides "
                   "train and are scored on it; the results JSON names it)")
    p.add_argument("--budget-min", type=float, default=20)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--sides", nargs="+", default=["agentjet", "trl"], choices=["agentjet", "trl"])
    p.add_argument("--arms", nargs="+", default=["as-is"], choices=list(ARMS),
                   help="AgentJet arms (each run for every seed; as-is: the demo; levels: difficulty levels)")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--eval-n", type=int, default=None, help="held-out episodes per checkpoint (default: the task's, "
                   "44 for addition)")
    p.add_argument("--target", type=float, default=None, help="the held-out target (default: 0.75 on addition, 0.5 "
                   "on another task)")
    p.add_argument("--score-levels", type=int, default=3, help="with the levels arm: every AgentJet run's last "
                   "checkpoint is also scored at this many levels above the task's own (capped at its top)")
    p.add_argument("--quick", action="store_true", help="tiny model, 40 s budget, 4 eval tasks: plumbing only")
    p.add_argument("--out", type=Path, default=None, help="the results JSON (default: vs_trl.json for addition, "
                   "else vs_trl_<task>.json; _levels with the levels arm)")
    p.add_argument("--resume", action="store_true",
                   help="keep the runs already in --out (same task, model, budget and eval size) and run only the "
                        "missing ones: a long ablation can span sessions; each run records its own commit")
    # one side (internal: the orchestrator runs each side in a subprocess)
    p.add_argument("--side", choices=["agentjet", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--arm", default="as-is", choices=list(ARMS), help=argparse.SUPPRESS)
    p.add_argument("--budget-s", type=float, default=0, help=argparse.SUPPRESS)
    p.add_argument("--points", default="", help=argparse.SUPPRESS)
    p.add_argument("--ckpt-dir", default="", help=argparse.SUPPRESS)
    p.add_argument("--side-out", dest="side_out", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side:
        args.out = args.side_out
        _side_main(args)
        return
    if "trl" in args.sides:  # before any run: a missing TRL once surfaced only when the first run was saved
        try:
            importlib.metadata.version("trl")
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit("TRL is not installed in this venv: `make setup-bench` (or --sides agentjet)") from None

    from agentjet.models import resolve_model
    from agentjet.tasks import get_task, ladders

    task_mod = get_task(args.task)
    if getattr(task_mod, "rollout", None) is not None:
        raise SystemExit(f"{args.task} is a multi-turn task: the TRL side runs single-turn tasks only")
    task_ladders = ladders(task_mod)
    with_levels = "levels" in args.arms and "agentjet" in args.sides
    if with_levels and len(task_ladders) != 1:
        raise SystemExit(f"--arms levels: {args.task} needs difficulty levels and one task type "
                         f"(it has {len(task_ladders)} with levels)")
    args.target = args.target if args.target is not None else target_for(args.task)
    args.eval_n = args.eval_n or task_mod.RECOMMENDED.eval_n
    args.shared = shared_for(task_mod)
    args.out = args.out or default_out(args.task, args.arms, args.sides)
    if args.quick:
        args.model, args.budget_min, args.eval_n = "tiny-random", 40 / 60, 4
        args.out = args.out.with_name(args.out.stem + "_quick.json")
    ladder = next(iter(task_ladders.values()), None)
    named_level = ladder.named if ladder is not None else None
    first = ladder.start if ladder is not None else 0
    score_levels = (list(range(first + 1, min(first + args.score_levels, ladder.top) + 1))
                    if with_levels and ladder is not None else [])
    model = str(resolve_model(args.model))
    minutes = [m for m in EVAL_POINTS_MIN if m <= args.budget_min] if not args.quick else [0.25, 0.5]
    if args.budget_min not in minutes:
        minutes.append(args.budget_min)
    eval_tasks = task_mod.generate_tasks("eval", args.eval_n, seed=0)
    runs, base = _resumed(args) if args.resume else ([], None)
    if base is None:
        base = float(evaluate_checkpoint(model, eval_tasks, args.task))  # type: ignore[arg-type]
    print(f"base model on {args.task}: held-out eval {base:.3f} ({args.eval_n} episodes)", flush=True)
    done = {(r["side"], r["seed"]) for r in runs}
    commit = git_commit(ROOT)
    for seed in args.seeds:
        for side, arm in [(s, a) for s in args.sides for a in (args.arms if s == "agentjet" else ["as-is"])]:
            label = side_label(side, arm)
            if (label, seed) in done:
                print(f"== {label}, seed {seed}: kept from {args.out}", flush=True)
                continue
            ckpt = Path(tempfile.mkdtemp(prefix=f"vs-trl-{side}-{seed}-"))
            side_out = ckpt / "side.json"
            cmd = [sys.executable, __file__, "--side", side, "--arm", arm, "--seed", str(seed), "--model", model,
                   "--task", args.task, "--budget-s", str(args.budget_min * 60),
                   "--points", ",".join(str(m * 60) for m in minutes), "--ckpt-dir", str(ckpt),
                   "--side-out", str(side_out)]
            print(f"== {label}, seed {seed}: {args.budget_min:g} min of training on {args.task} ...", flush=True)
            t0 = time.monotonic()
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.budget_min * 60 + 900)
            if proc.returncode != 0:
                print(proc.stdout[-3000:], proc.stderr[-5000:])
                raise SystemExit(f"{label} seed {seed} failed (exit {proc.returncode})")
            r = json.loads(side_out.read_text())
            score_run(r, args.task, eval_tasks, minutes, score_levels if side == "agentjet" else [], named_level)
            shutil.rmtree(ckpt, ignore_errors=True)
            r.update(side=label, arm=arm if side == "agentjet" else None, seed=seed, process_wall_s=time.monotonic() - t0, commit=commit,
                     measured_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), task=args.task)
            runs.append(r)
            print(f"   {r['steps']} steps, {r['generated_tokens']} tokens generated, {r['trained_tokens']} trained",
                  flush=True)
            save(args, runs, minutes, base, complete=False, commit=commit)
    summary = save(args, runs, minutes, base, complete=True, commit=commit)
    print_summary(args, summary, runs)


def print_summary(args: argparse.Namespace, summary: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    labels = list(dict.fromkeys(r["side"] for r in runs))
    cols = summary[labels[0]]["eval_at_min"]
    print("\n| | " + " | ".join(f"eval @ {float(m):g} min" for m in cols)
          + f" | min to {args.target} | late mean eval | late decline | steps/min | gen tok/min | trained tok/min |")
    for side in labels:
        sm = summary[side]
        late = "-" if sm["late_mean_eval"] is None else f"{sm['late_mean_eval']:.3f} | {sm['late_decline']:.3f}"
        evals = " | ".join(f"{v:.3f}" if v is not None else "-" for k, v in sm["eval_at_min"].items())
        ttt = f"{sm['time_to_target_min']:.2f}" if sm["time_to_target_min"] is not None else "not reached"
        late = late if sm["late_mean_eval"] is not None else "- | -"
        print(f"| {side} | {evals} | {ttt} | {late} | {sm['steps_per_min']:.2f} | {sm['generated_tokens_per_min']:.0f} | "
              f"{sm['trained_tokens_per_min']:.0f} |")
    for side in labels:
        sm = summary[side]
        if sm["uniform_share_after_5"] is not None or sm["final_by_level"]:
            print(f"{side}: uniform share after minute {LATE_FROM_MIN:g} {sm['uniform_share_after_5_by_seed']}, train "
                  f"steps after it {sm['steps_after_5_by_seed']}, largest fall from best {sm['fall_from_best_by_seed']}, "
                  f"highest level {sm['highest_level_by_seed']}, last checkpoint by level {sm['final_by_level']}")
    if (checks := summary.get("holding_checks")) is not None:
        print(f"the checks: time to {args.target} {checks['time_to_target_ratio']:.2f}x TRL's "
              f"(<= {MAX_TIME_TO_TARGET_RATIO}: {checks['time_to_target_ok']}); mean eval >= TRL's from minute "
              f"{LATE_FROM_MIN:g}: " + ", ".join(
                  f"{m} min {p['agentjet']:.3f} vs {p['trl']:.3f}" + (" (inside the SE)" if p["inside_se"] else "")
                  for m, p in checks["late_points"].items())
              + f" ({checks['late_points_ok']}); largest fall from best by seed "
              + ", ".join(f"{f:.3f}" for f in checks["fall_from_best_by_seed"] if f is not None)
              + f" (<= {MAX_FALL_FROM_BEST}: {checks['fall_ok']})")
    print(f"saved {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
