"""The demo on the tiny model: a server subprocess really trains, and the eval numbers come from held-out
episodes the server never trained on."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from types import ModuleType

import pytest
from rich.console import Console

from agentjet import tasks
from agentjet.apps.demo import DemoSettings, run_demo
from agentjet.tasks import Recommended

EVAL_N = 4


def parity_task() -> ModuleType:
    """A task the tiny random model gets right about half the time (an even-length reply), so its groups
    disagree and the server has something to train on. Train and eval prompts differ, and so do their ids."""
    mod = ModuleType("parity")
    mod.NAME = "parity"
    mod.SAMPLING = {"temperature": 1.0, "max_tokens": 6}
    mod.EVAL_SAMPLING = {"temperature": 1.0, "max_tokens": 6, "seed": 100}
    mod.RECOMMENDED = Recommended(learning_rate=1e-3, group_size=2, batch_groups=1, steps=2, eval_n=EVAL_N)

    def generate_tasks(split: str, n: int, seed: int = 0) -> list[dict]:
        return [{"task_id": f"parity-{split}-{i % 8}", "task_type": "parity", "split": split,
                 "messages": [{"role": "user", "content": f"{split} item {i % 8}: say anything."}]}
                for i in range(n)]

    def reward(task: dict, text: str) -> float:
        return float(len(text) % 2 == 0)

    mod.generate_tasks, mod.reward = generate_tasks, reward
    return mod


@pytest.mark.server
def test_demo_trains_and_evaluates_on_held_out_episodes(tiny_model_path: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(tasks.TASKS, "parity", parity_task())
    out = tmp_path / "demo"
    console = Console(record=True, width=200)
    with caplog.at_level(logging.WARNING):
        result = run_demo(DemoSettings(model=str(tiny_model_path), task="parity", concurrency=4, out_dir=out,
                                       time_budget_s=120, eval_every_s=0, early_stop=False), console)

    # The server process trained: the steps are in its own store, and the run stopped at the step target.
    assert "AgentJet server" in (out / "server.log").read_text()
    db = sqlite3.connect(out / "server" / "store.sqlite")
    steps = db.execute("SELECT COUNT(*) FROM steps").fetchone()[0]
    trained = db.execute("SELECT task_id FROM episodes WHERE consumed_step IS NOT NULL").fetchall()
    evals = db.execute("SELECT task_id, reward FROM episodes WHERE status='eval' ORDER BY seq").fetchall()
    db.close()
    assert result.stop_reason == "steps" and steps >= result.train_steps >= 2  # polled: it may overshoot
    assert trained and all(t.startswith("parity-train-") for (t,) in trained)
    assert "train reward" in console.export_text()

    # The eval numbers are the means of the server's eval episodes, all on held-out prompts, never trained on.
    assert len(evals) == EVAL_N * len(result.evals) == EVAL_N * 2
    assert all(t.startswith("parity-eval-") for t, _ in evals)
    rewards = [json.loads(r) for _, r in evals]
    rewards = [r if isinstance(r, float | int) else next(iter(r.values())) for r in rewards]
    assert result.eval_before == pytest.approx(sum(rewards[:EVAL_N]) / EVAL_N)
    assert result.eval_after == pytest.approx(sum(rewards[EVAL_N:]) / EVAL_N)
    assert result.evals[-1].train_steps == result.train_steps  # the last eval ran on the trained policy

    # The client holds the admin token: training really paused for the evals.
    assert not [r for r in caplog.records if "could not pause" in r.getMessage()]
    saved = json.loads((out / "demo_result.json").read_text())
    assert saved["eval_before"] == result.eval_before and saved["train_steps"] == result.train_steps
    assert [{k: v for k, v in e.items() if k != "minutes"} for e in saved["evals"]] == \
        [e.model_dump() for e in result.evals]  # each eval as its record, plus its wall minutes
    assert saved["merge_ratio"] == pytest.approx(1.0)  # one call per episode: one sample each
    assert saved["provenance"]["engine"] == "hf+in-process" and saved["provenance"]["device"] == "cpu"
    assert saved["provenance"]["commit"] and saved["provenance"]["machine"]  # where the figure was measured
    assert (out / "reward_curve.png").stat().st_size > 1000
