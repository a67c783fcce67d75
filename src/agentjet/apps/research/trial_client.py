"""The built-in trial client: train on a task's train split, evaluate on its held-out split every
``eval_every`` train steps, write ``result.json``.

    python -m agentjet.apps.research.trial_client --server URL --settings client.json --seed 0 --out DIR

Training, pauses and stops are the driver's (``agentjet.client.driver``): each eval point is taken with training
paused (``SwarmClient.pause(wait_for_step=True)``: the answer waits for a step in progress), so every eval
episode of a point runs at one policy version and the server's ``eval_reward`` for that version is the point's
value. The time budget counts training time (the evals' pauses excluded). The group size comes from the server's
status, so a search over ``server.group-size`` needs nothing on the client side.

The seed sets the order of the training tasks; generation is not seeded, so seeds are replicates.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentjet.apps.research.monitor import RESULT_FILE, TrialResult, parse_status
from agentjet.apps.research.spec import TrialClientSettings
from agentjet.client.client import SwarmClient
from agentjet.client.driver import Driver, EvalPoint, Stop, held_out
from agentjet.client.runner import task_workflow
from agentjet.client.settings import RunSettings
from agentjet.files import write_atomic
from agentjet.protocol import SWARM_PREFIX, ServerStatus
from agentjet.tasks import Recommended, TaskSource, get_task

log = logging.getLogger("agentjet.apps.research.trial")

EVALS_FILE = "evals.jsonl"
WATCH_S = 0.2  # status polls while training: a step may slip in between a poll and the pause
_TASK_API = ("generate_tasks", "reward", "SAMPLING", "EVAL_SAMPLING")


def load_task(name: str) -> TaskSource:
    """A task by name (``agentjet.tasks.get_task``: built-in or ``rg:...``), or a task module from
    ``path/to/task.py`` (same interface as agentjet.tasks)."""
    module: Any
    if name.endswith(".py"):
        path = Path(name)
        if not path.exists():
            raise ValueError(f"task file {path} does not exist")
        spec = importlib.util.spec_from_file_location(f"agentjet_task_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = get_task(name)
    missing = [a for a in _TASK_API if not hasattr(module, a)]
    if missing:
        raise ValueError(f"task {name!r} lacks {missing}")
    return module


def eval_n_for(settings: TrialClientSettings) -> int:
    """Held-out episodes per eval point: the setting, else the task's recommendation, else 44."""
    if settings.eval_n:
        return settings.eval_n
    rec = getattr(load_task(settings.task), "RECOMMENDED", None)
    return rec.eval_n if rec is not None else Recommended.model_fields["eval_n"].default


def group_size_of(status: ServerStatus) -> int:
    cfg = status.config
    training = cfg.get("training")
    training = training if isinstance(training, dict) else cfg
    return int(training.get("group_size", 4))


class TrialClient:
    def __init__(self, client: SwarmClient, settings: TrialClientSettings, seed: int, out_dir: Path) -> None:
        self.client = client
        self.s = settings
        self.seed = seed
        self.out_dir = out_dir
        self.task = load_task(settings.task)
        self.eval_n = eval_n_for(settings)
        overrides = {"temperature": settings.temperature, "top_p": settings.top_p, "max_tokens": settings.max_tokens}
        self.train_sampling = {**self.task.SAMPLING, **{k: v for k, v in overrides.items() if v is not None}}
        self.eval_sampling = dict(self.task.EVAL_SAMPLING)
        if settings.max_tokens is not None:
            self.eval_sampling["max_tokens"] = settings.max_tokens
        self.evals: list[EvalPoint] = []

    @staticmethod
    def _admin_token() -> str | None:
        """The trial server's admin token (the runner hands it over in the environment)."""
        return os.environ.get("AGENTJET_ADMIN_TOKEN")

    async def status(self) -> ServerStatus:
        """The server's status (a NaN train metric is read as NaN: the study runner judges it)."""
        return parse_status(await self.client.request("GET", f"{SWARM_PREFIX}/status"))

    def record(self, point: EvalPoint) -> None:
        record = point
        self.evals.append(record)
        with open(self.out_dir / EVALS_FILE, "a") as f:
            f.write(record.model_dump_json() + "\n")
        log.info("eval at policy v%d (step %d): %.3f over %d episodes", record.policy_version, record.train_steps,
                 record.reward, record.episodes)

    def train_tasks(self) -> Iterator[dict[str, Any]]:
        """Endless seeded rounds over the train split; every task id is unique (a group never spans phases)."""
        round_ = 0
        while True:
            for t in self.task.generate_tasks("train", self.s.pool, seed=self.seed * 100_003 + round_):
                yield {**t, "task_id": f"{t['task_id']}-s{self.seed}-r{round_}"}
            round_ += 1

    async def run(self) -> TrialResult:
        t0 = time.monotonic()
        group_size = group_size_of(await self.status())
        eval_tasks = [{**t, "index": i} for i, t in enumerate(self.task.generate_tasks("eval", self.eval_n, seed=0))]
        settings = RunSettings(group_size=group_size, concurrency=self.s.concurrency, poll_s=WATCH_S,
                               eval_every_steps=self.s.eval_every, max_steps=self.s.steps,
                               time_budget_s=self.s.time_budget_s)
        driver = Driver(self.client, task_workflow(self.task, self.train_sampling, model="trial"), settings,
                        evaluate=held_out(self.client, task_workflow(self.task, self.eval_sampling, model="trial"), eval_tasks,
                                          self.s.concurrency),
                        admin_token=self._admin_token(), on_eval=self.record)
        run = await driver.run(self.train_tasks())
        reasons: dict[str, str] = {Stop.STEPS: "steps reached",
                                   Stop.TIME_BUDGET: f"time budget of {self.s.time_budget_s:.0f}s"}
        stop_reason = reasons.get(run.stop_reason, run.stop_reason)
        final = await self.status()
        return TrialResult(ok=True, stop_reason=stop_reason, evals=self.evals, final_status=final.model_dump(),
                           train_episodes=run.train.episodes, failed_episodes=run.train.failed,
                           seconds=time.monotonic() - t0)


def write_result(out_dir: Path, result: TrialResult) -> None:
    write_atomic(out_dir / RESULT_FILE, result.model_dump_json(indent=1))


async def _main(url: str, settings: TrialClientSettings, seed: int, out_dir: Path) -> TrialResult:
    async with SwarmClient(url, client_id=f"research-trial-s{seed}") as client:
        return await TrialClient(client, settings, seed, out_dir).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--settings", required=True, type=Path, help="TrialClientSettings as JSON")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("agentjet").setLevel(logging.INFO)  # not every HTTP request of the libraries below
    settings = TrialClientSettings.model_validate(json.loads(args.settings.read_text()))
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        result = asyncio.run(_main(args.server, settings, args.seed, args.out))
    except Exception as exc:
        log.exception("the trial client failed")
        write_result(args.out, TrialResult(ok=False, stop_reason=f"{type(exc).__name__}: {exc}"))
        return 1
    write_result(args.out, result)
    log.info("done: %s; evals %s", result.stop_reason, [(e.policy_version, round(e.reward, 3)) for e in result.evals])
    return 0


if __name__ == "__main__":
    sys.exit(main())
