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
from agentjet.client.settings import RunSettings
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
        result = run_demo(DemoSettings(model=str(tiny_model_path), task="parity", out_dir=out, early_stop=False,
                                       run=RunSettings(concurrency=4, time_budget_s=120, eval_every_s=0)), console)

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


def test_the_run_settings_a_task_recommends_fill_only_what_is_not_set() -> None:
    from agentjet.apps.demo import run_settings, server_config
    from agentjet.tasks import addition

    rec = addition.RECOMMENDED
    run = run_settings(DemoSettings(), rec)
    assert (run.group_size, run.concurrency, run.max_steps, run.eval_every_s) == (
        rec.group_size, rec.concurrency, rec.steps, rec.eval_every_s)
    assert run.time_budget_s == RunSettings().time_budget_s and not run.keep_best  # not the task's: the run's
    given = DemoSettings(learning_rate=1e-4, batch_groups=3,
                         run=RunSettings(group_size=2, concurrency=5, max_steps=7, eval_every_s=0, keep_best=True))
    run = run_settings(given, rec)
    assert (run.group_size, run.concurrency, run.max_steps, run.eval_every_s, run.keep_best) == (2, 5, 7, 0, True)
    config = server_config(given, 1234, rec)  # what the demo's server trains with: the same values, once each
    assert config.learner.learning_rate == 1e-4 and config.generator.max_batch_size == 5
    assert (config.training.group_size, config.training.batch_groups) == (2, 3)
    default = server_config(DemoSettings(), 1234, rec)
    assert default.learner.learning_rate == rec.learning_rate and default.training.batch_groups == rec.batch_groups


def test_ajet_demo_options_are_generated_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every field of DemoSettings and of its RunSettings is an option of ``ajet demo`` (with its description), and
    the options given reach the demo's settings parsed, the ones left out unset."""
    from typer.testing import CliRunner

    from agentjet.cli import app

    runner = CliRunner()
    shown = runner.invoke(app, ["demo", "--help"], env={"COLUMNS": "300"}).output
    for name, info in {**DemoSettings.model_fields, **RunSettings.model_fields}.items():
        if name in ("run", "level_rule"):  # blocks: their own settings are options (below)
            continue
        flag = (info.json_schema_extra or {}).get("flag", name.replace("_", "-"))  # type: ignore[union-attr]
        assert f"--{flag}" in shown, flag
        assert str(info.description)[:30] in " ".join(shown.split()), name
    from agentjet.settings.fields import model_fields

    leaves = model_fields(DemoSettings)  # every leaf setting, nested blocks' included (run.level_rule.window ...)
    assert {f.dotted for f in leaves} >= {"levels", "run.keep_best", "run.level_rule.window"}
    for f in leaves:
        assert f"--{f.flag}" in shown and str(f.info.description)[:30] in " ".join(shown.split()), f.dotted
    assert "--level-window" in shown and "--level-rise-share" in shown
    seen: list[DemoSettings] = []

    class Result:
        eval_before, eval_after = 0.1, 0.2

    monkeypatch.setattr("agentjet.apps.demo.run_demo", lambda s, console: seen.append(s) or Result())
    args = ["demo", "--keep-best", "--concurrency", "3", "--steps", "4", "--eval-at-s", "60,120", "--lr", "3e-5",
            "--time-budget-s", "90", "--no-curriculum"]
    assert runner.invoke(app, args).exit_code == 0
    s = seen[-1]
    assert s.run.keep_best and s.run.concurrency == 3 and s.run.max_steps == 4 and s.run.eval_at_s == (60.0, 120.0)
    assert s.run.time_budget_s == 90.0 and s.learning_rate == 3e-5 and not s.curriculum
    assert s.run.model_fields_set == {"keep_best", "concurrency", "max_steps", "eval_at_s", "time_budget_s"}
    bad = runner.invoke(app, ["demo", "--concurrency", "0"])
    assert bad.exit_code == 2 and "invalid settings" in bad.output and "concurrency" in bad.output
    assert len(seen) == 1


def test_the_level_rule_is_the_tasks_recommendation_unless_set() -> None:
    from agentjet.apps.demo import run_settings
    from agentjet.schedule import LevelSettings
    from agentjet.tasks import addition, ta

    assert run_settings(DemoSettings(), addition.RECOMMENDED).level_rule.window == 8  # addition's window
    assert run_settings(DemoSettings(), ta.RECOMMENDED).level_rule.window == 6  # a game's: shorter
    given = DemoSettings(run=RunSettings(level_rule=LevelSettings(window=3, probe=1)))
    rule = run_settings(given, addition.RECOMMENDED).level_rule
    assert (rule.window, rule.probe, rule.rise_share) == (3, 1, LevelSettings().rise_share)
    assert not DemoSettings().levels  # off by default: it is on only once a measurement says it wins


def test_the_demo_server_gets_its_replicas_with_the_cores_shared() -> None:
    """``ajet demo --generator-replicas N``: the demo's server starts N generator replicas, each with an even share
    of this machine's cores (at least one); one replica leaves the fleet's settings at their defaults."""
    import os

    from agentjet.apps.demo import server_config
    from agentjet.tasks import get_task

    rec = get_task("addition").RECOMMENDED
    cores = len(os.sched_getaffinity(0))
    two = server_config(DemoSettings(generator_replicas=2), 1234, rec)
    assert two.generator.replicas == 2 and two.generator.fleet.threads == max(cores // 2, 1)
    one = server_config(DemoSettings(), 1234, rec)
    assert one.generator.replicas == 1 and one.generator.fleet.threads is None
    with pytest.raises(ValueError, match="generator_replicas"):
        DemoSettings(generator_replicas=0)
