"""The demo: a swarm server (its own process) and a client train SmolLM2 on a built-in task.

1. Start ``ajet server`` on a free loopback port.
2. Evaluate on the held-out split (eval episodes: never trained on).
3. Train (``agentjet.client.scheduled``): a curriculum draws each group's task, the held-out eval runs every
   ``eval_every_s``, and training stops at ``steps``, the time budget, or an eval plateau / solved task. With
   ``--levels`` each task type also moves up and down its difficulty levels (retirement works within a level);
   each eval then also scores the level being trained, and the levels are printed as they move.
4. Evaluate again, print before/after, save a reward-curve PNG (steps and wall-clock minutes; with several task
   types, a cocktail, also the held-out eval of each type; with levels, one curve per level) and a JSON summary.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from agentjet.client.client import SwarmClient
from agentjet.client.runner import ReplyTrace, task_workflow
from agentjet.client.scheduled import EvalPoint, StepPoint, run_scheduled
from agentjet.client.settings import RunSettings
from agentjet.models import DEFAULT_MODEL
from agentjet.observe.curveplot import Line, Panel, plot_curves
from agentjet.observe.learncurve import LearnCurve
from agentjet.runtime.launch import ServerProcess, start_ready
from agentjet.runtime.provenance import git_commit, machine
from agentjet.schedule import (
    Curriculum,
    CurriculumSettings,
    LevelChange,
    LevelledTasks,
    LevelSettings,
    StoppingRule,
    StopSettings,
)
from agentjet.settings import (
    EngineKind,
    FleetSettings,
    GeneratorSettings,
    LearnerGroupSettings,
    LearnerSettings,
    ServerConfig,
    TrainingSettings,
)
from agentjet.settings.load import dump_config
from agentjet.tasks import DEFAULT_TASK, LevelledSource, Recommended, TaskError, TaskSource, get_task, ladders


class DemoSettings(BaseModel):
    """``ajet demo``: a swarm server on a built-in task, and a client that trains it. The client's side is ``run``
    (the run's client-side settings, declared once in ``agentjet.client.settings``); each of its settings that a
    task recommends (``RECOMMENDED_RUN``) and that is not set comes from the task. ``ajet demo``'s options are
    generated from these fields."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(DEFAULT_MODEL, description="built-in name, local HF directory or hub id ORG/NAME")
    task: str = Field(DEFAULT_TASK, description="a built-in task (addition, calculator, lookup, toy) or rg:NAME, a "
                      "reasoning-gym dataset: rg:chain_sum:min_terms=2,max_terms=2, rg:A+B+C (a cocktail), "
                      "rg:mix.yaml (docs/environments.md)")
    learning_rate: float | None = Field(None, gt=0, description="the learner's learning rate (default: the task's)",
                                        json_schema_extra={"flag": "lr", "aliases": ["learning-rate"]})
    batch_groups: int | None = Field(None, ge=1, description="groups per train step (default: the task's)")
    eval_tasks: int | None = Field(None, ge=1, description="held-out eval episodes at each eval point (default: "
                                   "the task's recommendation)")
    max_staleness: int = Field(2, ge=0, description="policy versions an episode may lag and still be trained on")
    out_dir: Path = Field(Path("runs/demo"), description="where the log, plot and JSON go")
    port: int | None = Field(None, ge=1, le=65535, description="the server's port (default: a free one)")
    engine: EngineKind = Field(EngineKind.HF, description="hf: the embedded engine; vllm: roll out on a managed "
                               "vLLM subprocess (make setup-vllm)")
    train_procs: int = Field(0, ge=0, le=64, description="train on an FSDP2 trainer group of this many ranks "
                             "(torchrun; gloo on CPU) instead of in the server process (beside either generator)")
    generator_replicas: int = Field(1, ge=1, le=64, description="generator replicas behind the server's router "
                                    "(engine processes; on the CPU each gets an even share of the cores: "
                                    "docs/distributed.md)")
    curriculum: bool = Field(True, description="draw each group's task by its recent results (retire solved)")
    levels: bool = Field(False, description="difficulty levels: a task type's level rises when its groups are "
                         "mostly solved and falls back when they fail (retirement works within a level), and each "
                         "eval also scores the level trained; off by default until a measurement shows it wins "
                         "(docs/benchmarks.md)")
    early_stop: bool = Field(True, description="stop on an eval plateau or when groups stop teaching")
    seed: int = Field(0, ge=0, description="seed of the engine's sampling and the curriculum's order")
    run: RunSettings = Field(default_factory=RunSettings, description="the client's side of the run")


# The run's settings a task recommends (a RunSettings field -> the Recommended field): unless set, the task's value.
# The concurrency is also the engine's batch size.
RECOMMENDED_RUN = {"group_size": "group_size", "concurrency": "concurrency", "max_steps": "steps",
                   "eval_every_s": "eval_every_s"}


def run_settings(s: DemoSettings, rec: Recommended) -> RunSettings:
    """The run's client-side settings: ``s.run``, with the task's recommendation for each of ``RECOMMENDED_RUN``
    that ``s.run`` does not set, and for each of the levels' settings that ``s.run.level_rule`` does not set."""
    rule = s.run.level_rule
    levels = LevelSettings(**{**rec.levels, **rule.model_dump(include=rule.model_fields_set)})
    return s.run.model_copy(update={**{k: getattr(rec, r) for k, r in RECOMMENDED_RUN.items()
                                       if k not in s.run.model_fields_set}, "level_rule": levels})


@dataclass
class DemoResult:
    eval_before: float
    eval_after: float
    train_steps: int
    policy_version: int
    train_episodes: int
    failed_episodes: int
    seconds: float
    reward_by_version: dict[int, float] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    evals: list[EvalPoint] = field(default_factory=list)  # every held-out eval (before, periodic, after)
    steps: list[dict[str, Any]] = field(default_factory=list)  # each train step: minutes, step, train reward
    stop_reason: str = ""
    groups: int = 0
    uniform_groups: int = 0  # groups whose rewards were all equal (no learning signal)
    merge_ratio: float = float("nan")  # chat calls per training sample (timeline merging)
    curriculum: dict[str, int] = field(default_factory=dict)  # train tasks per state at the end
    provenance: dict[str, str] = field(default_factory=dict)  # commit, machine, device
    # tasks that trace their episodes (``EpisodeTrace``, ``tool_use_summary``): tool use at each held-out eval
    # (minutes, step, success, tool-call and correct-call shares, turns), and the first eval tasks' transcripts
    # at the first and the last eval
    tool_use: list[dict[str, Any]] = field(default_factory=list)
    transcripts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # each held-out eval by task type (a cocktail's datasets): minutes, train_steps, {type: mean reward},
    # {type: episodes}
    eval_by_type: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None  # with keep_best: the pinned best checkpoint (path, eval, steps, version)
    # with levels: the settings, each type's ladder (top, start, named level, labels), where each ended, the
    # highest reached, and each move (``moves``, at its minutes since training started, as the evals' ``minutes``)
    levels: dict[str, Any] = field(default_factory=dict)

    def curve(self) -> LearnCurve:
        """The held-out eval curve."""
        return LearnCurve(task=str(self.settings.get("task", "")), points=list(self.evals))

    def to_json(self) -> dict[str, Any]:
        """``demo_result.json``: the fields, each eval as its record plus its wall ``minutes``."""
        data = asdict(self)
        data["evals"] = [{**e.model_dump(), "minutes": e.seconds / 60 if e.seconds is not None else None}
                         for e in self.evals]
        return data


def question_of(task: dict[str, Any]) -> str:
    """What a transcript is an answer to: a chat task's last message, or a game and its seed."""
    if "messages" in task:
        return str(task["messages"][-1]["content"])
    return f"{task.get('game', task['task_id'])} at seed {task.get('seed')}"


TRANSCRIPTS = 5  # eval tasks whose multi-turn transcripts the demo keeps (first and last eval); single-call
# tasks keep every eval reply


def by_type(done: list[tuple[dict[str, Any], Any]]) -> tuple[dict[str, float], dict[str, int]]:
    """The mean eval reward and episode count of each task type (``task_type``, else the task's name)."""
    rewards: dict[str, list[float]] = {}
    for task, trace in done:
        rewards.setdefault(str(task.get("task_type", "task")), []).append(float(trace.reward))
    return {t: sum(r) / len(r) for t, r in rewards.items()}, {t: len(r) for t, r in rewards.items()}


def fleet_settings(replicas: int) -> FleetSettings:
    """N replicas on this machine's CPU share its cores evenly (on a GPU the fleet's own defaults place them)."""
    return FleetSettings(threads=max(len(os.sched_getaffinity(0)) // replicas, 1)) if replicas > 1 else FleetSettings()


def server_config(s: DemoSettings, port: int, rec: Recommended, admin_token: str | None = None) -> ServerConfig:
    """The demo server's settings (handed to the child ``ajet server`` as a config file): the demo's, else the
    task's recommendation. The client pauses training for its periodic evals, so it holds the admin token."""
    run = run_settings(s, rec)
    return ServerConfig(
        model=s.model, port=port, data_dir=s.out_dir / "server", log_level="INFO", admin_token=admin_token,
        generator=GeneratorSettings(kind=s.engine, max_batch_size=run.concurrency, seed=s.seed,
                                    replicas=s.generator_replicas, fleet=fleet_settings(s.generator_replicas)),
        learner=LearnerSettings(learning_rate=s.learning_rate or rec.learning_rate,
                                group=LearnerGroupSettings(procs=s.train_procs)),
        training=TrainingSettings(**{**rec.training(), "group_size": run.group_size,
                                     "batch_groups": s.batch_groups or rec.batch_groups},
                                  max_staleness=s.max_staleness, checkpoint_every=0))


def save_plot(result: DemoResult, path: Path) -> bool:
    """Train reward per step, and train reward and held-out eval against wall-clock minutes."""
    curve = result.curve()
    versions = sorted(result.reward_by_version)
    steps = [p for p in result.steps if "reward_mean" in p]
    evals = {"marker": "s", "color": "green"}
    by_step = Panel([Line(xy=[(v, result.reward_by_version[v]) for v in versions], label="train reward (sampled)",
                          style={"marker": "o"}),
                     Line(curve, label="held-out eval", style=evals)],
                    x="steps", xlabel="policy version (train steps)", ylabel="mean reward")
    by_time = Panel([Line(xy=[(p["minutes"], p["reward_mean"]) for p in steps],
                          label="train reward (trained batches: mixed groups)", style={"marker": ".", "alpha": 0.7}),
                     Line(curve, label="held-out eval", style=evals)],
                    x="minutes", xlabel="wall-clock minutes (evals included)")
    panels = [by_step, by_time]
    types = sorted({t for row in result.eval_by_type for t in row["rewards"]})
    if len(types) > 1:  # a cocktail: the held-out eval of each task type
        panels.append(Panel([Line(xy=[(row["minutes"] or 0.0, row["rewards"][t]) for row in result.eval_by_type
                                      if t in row["rewards"]], label=f"{t} (held-out)", style={"marker": "s"})
                             for t in types], x="minutes", xlabel="wall-clock minutes (evals included)",
                            ylabel="held-out eval reward", title="held-out eval per task type", legend="best"))
    if result.levels:  # one curve per level: the task as named, and each level trained when it was evaluated
        panels.append(level_panel(result))
    return plot_curves(panels, path, cols=len(panels), figsize=(5.5 * len(panels), 4), dpi=120,
                       title=f"AgentJet demo: {result.settings.get('model')} on {result.settings.get('task')} "
                             f"(eval {result.eval_before:.3f} -> {result.eval_after:.3f}, {result.seconds / 60:.1f} min)")


def level_panel(result: DemoResult) -> Panel:
    """The held-out eval per difficulty level: the task as named (the fixed starting point) and one curve per
    (task type, level) from the evals at it."""
    named = Line(result.curve(), label="as named (the start)", style={"marker": "s", "color": "green"})
    series: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for e in result.evals:
        for t, r in e.level_rewards.items():
            series.setdefault((t, e.levels[t]), []).append((e.minutes or 0.0, r))
    one_type = len({t for t, _ in series}) <= 1
    lines = [Line(xy=pts, label=f"level {k}" if one_type else f"{t} level {k}", style={"marker": "o"})
             for (t, k), pts in sorted(series.items())]
    return Panel([named, *lines], x="minutes", xlabel="wall-clock minutes (evals included)",
                 ylabel="held-out eval reward", title="held-out eval per level", legend="best")


def run_demo(s: DemoSettings, console: Console | None = None) -> DemoResult:
    console = console or Console()
    task_mod = get_task(s.task)
    if s.levels and not ladders(task_mod):
        raise TaskError(f"{s.task} has no difficulty levels (addition, rg: datasets with a reasoning-gym curriculum "
                        "and GuessTheNumber have them; docs/environments.md): run it without --levels")
    rec = task_mod.RECOMMENDED
    run = run_settings(s, rec)
    eval_n = s.eval_tasks or rec.eval_n
    s.out_dir.mkdir(parents=True, exist_ok=True)
    log_path = s.out_dir / "server.log"
    admin_token = secrets.token_urlsafe(32)
    start = time.monotonic()
    console.print(f"starting the swarm server (log: {log_path}) ...")
    server = start_ready(lambda port: ServerProcess("demo", server_config(s, port, rec, admin_token), log_path,
                                                    s.out_dir / "server.yaml"), s.port)
    config, url = server.config, server.url
    console.print(f"[bold]AgentJet demo[/bold]: {s.model} learns '{s.task}' ({run.max_steps} steps, "
                  f"{config.training.group_size} episodes/group, {config.training.batch_groups} groups/step, "
                  f"lr {config.learner.learning_rate}); the swarm server is ready on {url}")
    try:
        result = asyncio.run(_client_side(s, task_mod, run, eval_n, rec.pool, url, admin_token, console))
    finally:
        server.stop(grace=120)
    result.seconds = time.monotonic() - start
    # what the run used: the demo's settings and the run's (the task's where not set), flat; and the server's
    # settings as it ran them (engine, training, loss, tracking...; secrets masked)
    used = {**s.model_dump(exclude={"run"}), **run.model_dump()}
    result.settings = {**{k: str(v) for k, v in used.items()}, **rec.model_dump(),
                       "learning_rate": config.learner.learning_rate, "group_size": config.training.group_size,
                       "batch_groups": config.training.batch_groups, "concurrency": run.concurrency,
                       "eval_every_s": run.eval_every_s or 0.0, "eval_n": eval_n, "steps": run.max_steps,
                       "server": dump_config(config, reveal_secrets=False)}
    result.provenance = {"commit": git_commit(), "machine": machine(), **result.provenance}
    (s.out_dir / "demo_result.json").write_text(json.dumps(result.to_json(), indent=2, default=str))
    plot = s.out_dir / "reward_curve.png"
    saved = save_plot(result, plot)
    console.print(f"\n[bold]eval reward (held-out, {eval_n} tasks): before {result.eval_before:.3f} -> "
                  f"after {result.eval_after:.3f}[/bold]  ({result.train_steps} train steps, "
                  f"{result.train_episodes} training episodes, {result.seconds / 60:.1f} min)")
    console.print(f"stopped: {result.stop_reason or 'done'}; {result.uniform_groups} of {result.groups} groups had "
                  f"equal rewards; calls per training sample {result.merge_ratio:.2f}")
    if result.levels:
        console.print("levels: " + ", ".join(f"{t} ended at {k} (highest {result.levels['highest'][t]} of "
                                             f"{result.levels['ladders'][t]['top']})"
                                             for t, k in result.levels["levels"].items()))
    if result.best is not None:
        b = result.best
        console.print(f"best held-out eval {b['eval']:.3f} at step {b['train_steps']}: {b['path']} (export it with "
                      f"`ajet export {s.out_dir / 'server'} OUT --best`)", soft_wrap=True)
    console.print(f"saved {s.out_dir / 'demo_result.json'}" + (f" and {plot}" if saved else ""))
    return result


def train_pool(task_mod: TaskSource, n: int = 1024) -> list[dict[str, Any]]:
    """The distinct train tasks among the first ``n`` the task generates (the curriculum's pool). With several
    task types (a cocktail) the pool keeps as many of each type as the smallest type has, types in turn, so the
    curriculum's uniform draws give each type an equal share of the groups, as the server's equal quotas ask.
    Unequal draws starve the batch: with 533 tasks of which 50 were ``products``, the demo's 4 groups in flight
    all waited on types ahead of their share while no ``products`` group was drawn, and training stopped after 2
    steps (docs/environments.md)."""
    seen: dict[str, dict[str, Any]] = {}
    for t in task_mod.generate_tasks("train", n, seed=0):
        seen.setdefault(str(t["task_id"]), t)
    by_type: dict[str, list[dict[str, Any]]] = {}
    for t in seen.values():
        by_type.setdefault(str(t.get("task_type", "")), []).append(t)
    if len(by_type) < 2:
        return list(seen.values())
    keep = min(len(ts) for ts in by_type.values())
    return [ts[i] for i in range(keep) for ts in by_type.values()]


async def _client_side(s: DemoSettings, task_mod: TaskSource, settings: RunSettings, eval_n: int, pool_n: int,
                       url: str, token: str, console: Console) -> DemoResult:
    eval_tasks = [{**t, "index": i} for i, t in enumerate(task_mod.generate_tasks("eval", eval_n, seed=0))]
    started = [time.monotonic()]  # training's start (reset after the base eval): the evals' ``minutes`` clock
    moves: list[dict[str, Any]] = []

    def on_level(c: LevelChange) -> None:
        minutes = (time.monotonic() - started[0]) / 60
        moves.append({"minutes": minutes, "task_type": c.task_type, "old": c.old, "new": c.new,
                      "move": c.move.value, "reason": c.reason, "groups": c.groups})
        console.print(f"  [magenta]level[/magenta] {c.task_type}: {c.old} -> {c.new} ({c.move.value}: {c.reason}; "
                      f"{c.groups} groups at {c.old}) at {minutes:4.1f} min")

    task_ladders = ladders(task_mod) if s.levels else {}
    levels = LevelledTasks(task_ladders, settings.level_rule, pool_n=pool_n, seed=s.seed, on_change=on_level,
                           curriculum=CurriculumSettings() if s.curriculum else None) if task_ladders else None
    source: TaskSource = LevelledSource(task_mod, task_ladders) if task_ladders else task_mod
    pool = train_pool(task_mod, pool_n) if levels is None else []
    curriculum = Curriculum([str(t["task_id"]) for t in pool], seed=s.seed) if s.curriculum and pool else None
    stopping = StoppingRule(StopSettings(**task_mod.RECOMMENDED.stop)) if s.early_stop else None
    steps = settings.max_steps

    eval_traces: list[tuple[dict[str, Any], Any]] = []
    tool_use: list[dict[str, Any]] = []
    transcripts: dict[str, list[dict[str, Any]]] = {}
    eval_types: list[dict[str, Any]] = []

    def on_eval(p: EvalPoint) -> None:
        console.print(f"  [green]eval[/green] at {p.minutes or 0.0:4.1f} min, step {p.train_steps:3d}: held-out reward "
                      f"{p.reward:.3f} ({p.episodes} tasks, {p.eval_seconds:.0f}s)")
        if p.seconds == 0.0:  # the base eval (the training clock has not started): training starts now
            started[0] = time.monotonic()
        if p.levels:
            console.print("        at the level trained: " + ", ".join(
                f"{t} level {k} {p.level_rewards.get(t, float('nan')):.3f}" for t, k in p.levels.items()))
        if not eval_traces:
            return
        named = [tt for tt in eval_traces if tt[0].get("level") is None  # the task as named (a level's are apart)
                 or task_ladders[str(tt[0]["task_type"])].named == tt[0]["level"]]
        done = sorted(named, key=lambda tt: int(tt[0].get("index", 0)))
        eval_traces.clear()
        rewards, counts = by_type(done)
        eval_types.append({"minutes": p.minutes, "train_steps": p.train_steps, "rewards": rewards,
                           "episodes": counts})
        if len(rewards) > 1:
            console.print("        by task type: " + ", ".join(f"{t} {r:.3f}" for t, r in sorted(rewards.items())))
        kept = done if all(isinstance(tr, ReplyTrace) for _, tr in done) else done[:TRANSCRIPTS]
        transcripts["before" if len(eval_types) == 1 else "after"] = [
            {"task_id": t["task_id"], "question": question_of(t), "answer": t.get("answer"),
             "reward": tr.reward, "transcript": list(tr.transcript)} for t, tr in kept]
        if not hasattr(task_mod, "tool_use_summary"):
            return
        row = task_mod.tool_use_summary([t for t, _ in done], [tr for _, tr in done])
        tool_use.append({"minutes": p.minutes, "train_minutes": p.train_minutes,
                         "train_steps": p.train_steps, **row})
        console.print(f"        tool use: {row['tool_call_share']:.0%} of episodes call a tool, "
                      f"{row['correct_call_share']:.0%} call it correctly; {row['turns_per_episode']:.2f} turns "
                      "per episode")

    def on_step(p: StepPoint) -> None:
        m = p.metrics
        at = (" level " + ",".join(f"{k}" if len(now) == 1 else f"{t}:{k}" for t, k in now.items())
              if levels is not None and (now := levels.levels()) else "")
        console.print(f"  step {p.train_steps:3d}/{steps}  {p.seconds / 60:4.1f} min  policy v{p.policy_version}  "
                      f"train reward {m.get('reward_mean', float('nan')):.3f}  loss {m.get('loss', 0):+.4f}  "
                      f"step {m.get('step_seconds', 0):.1f}s{at}")

    def on_quiet(st: Any) -> None:  # say why nothing happens (a model that solves most tasks)
        b = st.buffer
        console.print(f"  ... collecting: {b.dropped_uniform_episodes} episodes so far in groups where every reward "
                      f"was equal (no learning signal, skipped), {b.pending_episodes} pending")

    async with SwarmClient(url, token=token, client_id="demo-client") as client:
        what = (f"{len(pool)} train tasks" + (", curriculum" if curriculum else "") if levels is None else
                "levels: " + ", ".join(f"{t} from {lad.start} of 0..{lad.top}" for t, lad in task_ladders.items())
                + (", curriculum within each" if s.curriculum else ""))
        console.print(f"evaluating the base model on {len(eval_tasks)} held-out tasks, then training ({what}) ...")
        run = await run_scheduled(client, task_workflow(source, task_mod.SAMPLING, model="demo"),
                                  task_workflow(source, task_mod.EVAL_SAMPLING, model="demo", traces=eval_traces),
                                  pool, eval_tasks, settings, curriculum=curriculum, levels=levels,
                                  stopping=stopping, on_step=on_step, on_eval=on_eval, on_quiet=on_quiet)
        status = await client.status()
    if run.stop_reason == "time_budget":
        budget_s = settings.time_budget_s or 0.0
        budget = f"{budget_s / 60:.0f} min" if budget_s >= 120 else f"{budget_s:.0f} s"
        console.print(f"  training budget of {budget} reached after {status.train_steps} of {steps} steps "
                      "(--time-budget-s to change)")
    elif run.stop_reason in ("solved", "eval_plateau", "no_signal"):
        console.print(f"  stopped early ({run.stop_reason}): {run.uniform_groups} of {run.groups} groups had equal "
                      f"rewards; evals {', '.join(f'{e.reward:.2f}' for e in run.evals)}")
    before, after = run.evals[0], run.evals[-1]
    return DemoResult(
        eval_before=before.reward, eval_after=after.reward, train_steps=status.train_steps,
        policy_version=status.policy_version, train_episodes=run.train.episodes, failed_episodes=run.train.failed,
        seconds=0.0, reward_by_version={v: sum(r) / len(r) for v, r in sorted(run.train_reward_by_version.items())},
        evals=list(run.evals),
        steps=[{"minutes": p.seconds / 60, "train_steps": p.train_steps, "policy_version": p.policy_version,
                **{k: p.metrics[k] for k in ("reward_mean", "loss", "step_seconds", "trained_tokens") if k in p.metrics}}
               for p in run.steps],
        stop_reason=run.stop_reason, groups=run.groups, uniform_groups=run.uniform_groups,
        merge_ratio=run.merge_ratio, curriculum=run.curriculum,
        provenance={"engine": status.engine, "device": str(status.engine_info.get("device", "unknown"))},
        tool_use=tool_use, transcripts=transcripts, eval_by_type=eval_types,
        best=run.best.model_dump() if run.best is not None else None,
        levels={**{k: v for k, v in run.levels.items() if k != "changes"}, "moves": moves} if run.levels else {})
