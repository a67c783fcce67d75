"""The demo's plumbing on the tiny model: a server subprocess, eval episodes, training, plot and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from agentjet.demo import DemoSettings, run_demo


@pytest.mark.server
def test_demo_runs_end_to_end_on_tiny_model(tiny_model_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo"
    console = Console(record=True, width=200)
    result = run_demo(DemoSettings(model=str(tiny_model_path), steps=1, group_size=2, batch_groups=1, eval_tasks=4,
                                   concurrency=4, out_dir=out, time_budget_s=8, learning_rate=1e-3), console)
    saved = json.loads((out / "demo_result.json").read_text())
    assert saved["eval_before"] == result.eval_before
    assert 0.0 <= result.eval_before <= 1.0 and 0.0 <= result.eval_after <= 1.0
    assert result.train_episodes > 0 and result.failed_episodes == 0
    assert (out / "reward_curve.png").stat().st_size > 1000
    assert "AgentJet server" in (out / "server.log").read_text()  # the server really ran as its own process
    text = console.export_text()
    if result.train_steps < 1:  # the tiny model rarely earns a reward: the output must say why training stopped
        assert "training budget of 8 s reached after 0 of 1 steps" in text
    else:
        assert "step   1/1" in text
