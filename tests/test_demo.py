"""The demo's plumbing on the tiny model: a server subprocess, eval episodes, training, plot and JSON."""

from __future__ import annotations

import json
from pathlib import Path

from agentjet.demo import DemoSettings, run_demo


def test_demo_runs_end_to_end_on_tiny_model(tiny_model_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = run_demo(DemoSettings(model=str(tiny_model_path), steps=1, group_size=2, batch_groups=1, eval_tasks=4,
                                   concurrency=4, out_dir=out, time_budget_s=8, learning_rate=1e-3))
    saved = json.loads((out / "demo_result.json").read_text())
    assert saved["eval_before"] == result.eval_before
    assert 0.0 <= result.eval_before <= 1.0 and 0.0 <= result.eval_after <= 1.0
    assert result.train_episodes > 0 and result.failed_episodes == 0
    assert (out / "reward_curve.png").stat().st_size > 1000
    assert "AgentJet server" in (out / "server.log").read_text()  # the server really ran as its own process
