"""The demo: a swarm server (its own process) and a client train SmolLM2 on a built-in task.

1. Start ``ajet server`` on a free loopback port.
2. Evaluate on the held-out split (eval episodes: never trained on).
3. Train: the runner plays groups of episodes until the server has taken ``steps`` train steps.
4. Evaluate again, print before/after, save a reward-curve PNG and a JSON summary.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from rich.console import Console

from agentjet.client.client import Episode, SwarmClient
from agentjet.client.runner import RunSummary, run_workflow
from agentjet.launch import ServerProcess
from agentjet.settings import EngineSettings, ServerConfig, TrainingSettings
from agentjet.tasks import get_task


@dataclass
class DemoSettings:
    model: str = "smollm2-135m-instruct"
    task: str = "addition"
    steps: int | None = None  # default: the task's RECOMMENDED["steps"]
    learning_rate: float | None = None
    group_size: int | None = None
    batch_groups: int | None = None
    concurrency: int = 8
    eval_tasks: int | None = None  # default: the task's RECOMMENDED['eval_n'] (else 44)
    max_staleness: int = 2
    time_budget_s: float = 20 * 60
    out_dir: Path = Path("runs/demo")
    port: int | None = None
    engine: str = "hf"  # or "vllm": the server rolls out on a managed vLLM subprocess


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


def _workflow(task_mod: ModuleType, sampling: dict[str, Any], record: dict[int, list[float]] | None):
    async def workflow(task: dict[str, Any], ep: Episode) -> float:
        params = dict(sampling)
        if "seed" in params and "index" in task:
            params["seed"] = params["seed"] + int(task["index"])
        reply = await ep.openai().chat.completions.create(model="demo", messages=task["messages"], **params)
        reward = float(task_mod.reward(task, reply.choices[0].message.content or ""))
        if record is not None:
            record[ep.policy_version].append(reward)
        return reward

    return workflow


def server_config(s: DemoSettings, port: int, rec: dict[str, Any]) -> ServerConfig:
    """The demo server's settings (handed to the child ``ajet server`` as a config file)."""
    return ServerConfig(
        model=s.model, port=port, data_dir=s.out_dir / "server", log_level="INFO",
        engine=EngineSettings(kind=s.engine, max_batch_size=s.concurrency),
        training=TrainingSettings(group_size=rec["group_size"], batch_groups=rec["groups_per_batch"],
                                  learning_rate=rec["learning_rate"], max_staleness=s.max_staleness,
                                  checkpoint_every=0))


async def _evaluate(client: SwarmClient, task_mod: ModuleType, tasks: list[dict[str, Any]], concurrency: int
                    ) -> RunSummary:
    fn = _workflow(task_mod, task_mod.EVAL_SAMPLING, None)
    return await run_workflow(client, fn, tasks, group_size=1, concurrency=concurrency, eval=True)


async def _train(client: SwarmClient, task_mod: ModuleType, s: DemoSettings, rec: dict[str, Any], steps: int,
                 record: dict[int, list[float]], console: Console) -> RunSummary:
    done = asyncio.Event()
    deadline = time.monotonic() + s.time_budget_s

    async def monitor() -> None:
        last = -1
        quiet_since = time.monotonic()
        while not done.is_set():
            st = await client.status()
            if st.train_steps != last:
                last, quiet_since = st.train_steps, time.monotonic()
                m = st.last_train_metrics
                if m:
                    console.print(f"  step {st.train_steps:3d}/{steps}  policy v{st.policy_version}  "
                                  f"train reward {m.get('reward_mean', float('nan')):.3f}  "
                                  f"loss {m.get('loss', 0):+.4f}  step {m.get('step_seconds', 0):.1f}s")
            elif time.monotonic() - quiet_since > 60:  # say why nothing happens (a model that solves most tasks)
                quiet_since = time.monotonic()
                b = st.buffer
                console.print(f"  ... collecting: {b.dropped_uniform_episodes} episodes so far in groups where "
                              f"every reward was equal (no learning signal, skipped), {b.pending_episodes} pending")
            if st.train_steps >= steps:
                done.set()
            elif time.monotonic() > deadline:
                budget = f"{s.time_budget_s / 60:.0f} min" if s.time_budget_s >= 120 else f"{s.time_budget_s:.0f} s"
                console.print(f"  training budget of {budget} reached after {st.train_steps} of {steps} steps "
                              "(--time-budget-s to change)")
                done.set()
            await asyncio.sleep(1.0)

    def tasks() -> Iterator[dict[str, Any]]:
        round_ = 0
        while not done.is_set():
            for t in task_mod.generate_tasks("train", 64, seed=round_):
                if done.is_set():
                    return
                yield {**t, "task_id": f"{t['task_id']}-r{round_}"}
            round_ += 1

    watcher = asyncio.create_task(monitor())
    fn = _workflow(task_mod, task_mod.SAMPLING, record)
    summary = await run_workflow(client, fn, tasks(), group_size=rec["group_size"], concurrency=s.concurrency)
    await watcher
    return summary


def save_plot(result: DemoResult, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    versions = sorted(result.reward_by_version)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(versions, [result.reward_by_version[v] for v in versions], marker="o", label="train reward (sampled)")
    ax.axhline(result.eval_before, color="grey", linestyle="--", label=f"eval before {result.eval_before:.3f}")
    ax.axhline(result.eval_after, color="green", linestyle="--", label=f"eval after {result.eval_after:.3f}")
    ax.set_xlabel("policy version (train steps)")
    ax.set_ylabel("mean reward")
    ax.set_title(f"AgentJet demo: {result.settings.get('model')} on {result.settings.get('task')}")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def run_demo(s: DemoSettings, console: Console | None = None) -> DemoResult:
    from agentjet.launch import free_port

    console = console or Console()
    task_mod = get_task(s.task)
    rec = dict(task_mod.RECOMMENDED)
    for key, value in (("learning_rate", s.learning_rate), ("group_size", s.group_size),
                       ("groups_per_batch", s.batch_groups)):
        if value is not None:
            rec[key] = value
    steps = s.steps or int(rec["steps"])
    s.eval_tasks = s.eval_tasks or int(rec.get("eval_n", 44))
    s.out_dir.mkdir(parents=True, exist_ok=True)
    port = s.port or free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = s.out_dir / "server.log"
    server = ServerProcess("demo", server_config(s, port, rec), log_path, s.out_dir / "server.yaml")
    start = time.monotonic()
    console.print(f"[bold]AgentJet demo[/bold]: {s.model} learns '{s.task}' ({steps} steps, {rec['group_size']} "
                  f"episodes/group, {rec['groups_per_batch']} groups/step, lr {rec['learning_rate']})")
    console.print(f"starting the swarm server on {url} (log: {log_path}) ...")
    server.start()
    try:
        server.wait_ready()
        result = asyncio.run(_client_side(s, task_mod, rec, steps, url, console))
    finally:
        server.stop(grace=120)
    result.seconds = time.monotonic() - start
    result.settings = {**{k: str(v) for k, v in asdict(s).items()}, **rec, "steps": steps}
    (s.out_dir / "demo_result.json").write_text(json.dumps(asdict(result), indent=2, default=str))
    plot = s.out_dir / "reward_curve.png"
    saved = save_plot(result, plot)
    console.print(f"\n[bold]eval reward (held-out, {s.eval_tasks} tasks): before {result.eval_before:.3f} -> "
                  f"after {result.eval_after:.3f}[/bold]  ({result.train_steps} train steps, "
                  f"{result.train_episodes} training episodes, {result.seconds / 60:.1f} min)")
    console.print(f"saved {s.out_dir / 'demo_result.json'}" + (f" and {plot}" if saved else ""))
    return result


async def _client_side(s: DemoSettings, task_mod: ModuleType, rec: dict[str, Any], steps: int, url: str,
                       console: Console) -> DemoResult:
    eval_tasks = [{**t, "index": i} for i, t in enumerate(task_mod.generate_tasks("eval", s.eval_tasks, seed=0))]
    record: dict[int, list[float]] = defaultdict(list)
    async with SwarmClient(url, client_id="demo-client") as client:
        console.print(f"evaluating the base model on {len(eval_tasks)} held-out tasks ...")
        before = await _evaluate(client, task_mod, eval_tasks, s.concurrency)
        console.print(f"  eval reward before training: {before.mean_reward:.3f}")
        console.print("training ...")
        train = await _train(client, task_mod, s, rec, steps, record, console)
        console.print("evaluating the trained model ...")
        after = await _evaluate(client, task_mod, eval_tasks, s.concurrency)
        status = await client.status()
    return DemoResult(
        eval_before=before.mean_reward, eval_after=after.mean_reward, train_steps=status.train_steps,
        policy_version=status.policy_version, train_episodes=train.episodes,
        failed_episodes=train.failed + before.failed + after.failed, seconds=0.0,
        reward_by_version={v: sum(r) / len(r) for v, r in sorted(record.items())})
