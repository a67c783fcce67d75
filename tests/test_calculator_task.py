"""The multi-turn calculator agent: task splits, the tool, and its workflow through a real server with
timeline merging (one training sample per episode however many calls it made)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from types import SimpleNamespace

import pytest

from agentjet import SwarmClient
from agentjet.client.runner import run_workflow
from agentjet.tasks import calculator, get_task

TOOL_REPLY = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "47 + 38"}}\n</tool_call>'


def test_splits_are_disjoint_and_deterministic() -> None:
    train = calculator.generate_tasks("train", 300, seed=0)
    ev = calculator.generate_tasks("eval", 60, seed=0)
    assert {t["task_id"].split("-", 2)[2] for t in train}.isdisjoint({t["task_id"].split("-", 2)[2] for t in ev})
    assert calculator.generate_tasks("eval", 60, seed=0) == ev
    pairs = len(calculator.split_pairs("eval"))  # the recommended eval n weighs every held-out pair the same
    counts = Counter(t["task_id"] for t in calculator.generate_tasks("eval", calculator.RECOMMENDED.eval_n))
    assert len(counts) == pairs and set(counts.values()) == {calculator.RECOMMENDED.eval_n // pairs}
    assert all(int(t["answer"]) >= 0 for t in train + ev)
    assert get_task("calculator") is calculator
    with pytest.raises(ValueError):
        calculator.generate_tasks("test", 1)


def test_tool_and_reward() -> None:
    assert calculator.calculator("47 + 38") == "85" and calculator.calculator(" 90-12 ") == "78"
    assert calculator.calculator("import os").startswith("error")
    call = SimpleNamespace(function=SimpleNamespace(name="calculator", arguments=json.dumps({"expression": "3*4"})))
    assert calculator.run_tool(call) == "12"
    bad = SimpleNamespace(function=SimpleNamespace(name="calculator", arguments="{not json"))
    assert calculator.run_tool(bad).startswith("error")
    task = calculator.make_task(47, "+", 38)
    assert calculator.reward(task, "47 + 38 = 85") == 1.0 and calculator.reward(task, "86") == 0.0
    assert calculator.feedback(task, "80").startswith("Too low") and "No number" in calculator.feedback(task, "hm")


def _run(url: str, tasks: list[dict], group_size: int = 2):
    async def workflow(task, ep):  # noqa: ANN001
        return await calculator.rollout(task, ep, {"temperature": 0.7, "max_tokens": 64})

    async def main():
        async with SwarmClient(url) as client:
            return await run_workflow(client, workflow, tasks, group_size=group_size, concurrency=4)

    return asyncio.run(main())


def test_tool_calls_merge_into_one_sample(make_server) -> None:
    srv = make_server(reply=TOOL_REPLY)  # the agent calls the tool every turn and never answers
    tasks = calculator.generate_tasks("train", 2)
    summary = _run(srv.url, tasks)
    assert summary.failed == 0 and summary.rewards == [0.0] * 4
    assert summary.calls == 4 * calculator.MAX_TURNS and summary.samples == 4  # every episode merged to 1 sample
    prompt = srv.server.engine.generator.prompts[-1]
    text = srv.server.engine.tokenizer.decode(prompt)
    calls = text.count('<tool_call>\n{"name": "calculator"')
    assert "<tools>" in text and calls == calculator.MAX_TURNS - 1 and "85<|im_end|>" in text  # the tool's result


def test_multi_turn_workflow_on_the_tiny_model_produces_merged_samples(make_server) -> None:
    srv = make_server(engine="tiny")
    tasks = calculator.generate_tasks("train", 2)
    summary = _run(srv.url, tasks)
    assert summary.failed == 0 and summary.episodes == 4
    multi = summary.calls > summary.episodes  # the tiny model is wrong: the checker gives it more turns
    assert multi and summary.samples < summary.calls and summary.merge_ratio > 1.5
    st = srv.server.reader.count_by_status()
    assert st["pending"] + st["dropped_uniform"] + st["trained"] == 4


def test_calculator_example_through_ajet_run(make_server, tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    srv = make_server(reply=TOOL_REPLY)
    out = subprocess.run([sys.executable, "-m", "agentjet.cli", "run", str(root / "examples/calculator_agent.py:workflow"),
                          "--server", srv.url, "--dataset", str(root / "examples/data/calculator.jsonl"), "--limit", "2",
                          "--group-size", "2"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "4 episodes, 0 failed" in out.stdout
    assert f"{4 * calculator.MAX_TURNS} chat calls -> 4 training samples" in out.stdout
