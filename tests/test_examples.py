"""The examples run end to end against a real server (null engine that always answers '7')."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import wait_until

from agentjet import SwarmClient
from agentjet.client.runner import load_dataset, load_workflow, run_workflow

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "examples" / "data" / "math.jsonl"


@pytest.mark.parametrize("spec", ["examples/math_openai_sdk.py:workflow", "examples/math_langchain.py:workflow"])
def test_workflow_examples(make_server, spec: str) -> None:
    srv = make_server(reply="It is 7.")
    fn = load_workflow(str(ROOT / spec))
    tasks = load_dataset(DATA, limit=3)

    async def main():
        async with SwarmClient(srv.url) as client:
            return await run_workflow(client, fn, tasks, group_size=2, concurrency=4)

    summary = asyncio.run(main())
    assert summary.episodes == 6 and summary.failed == 0
    expected = [1.0 if t["answer"] == "7" else 0.0 for t in tasks for _ in range(2)]
    assert sorted(summary.rewards) == sorted(expected)
    assert srv.server.reader.count_by_status()["pending"] + srv.server.reader.count_by_status()["dropped_uniform"] == 6


def test_plain_http_example_needs_no_agentjet(make_server) -> None:
    srv = make_server(reply="7")
    source = (ROOT / "examples" / "math_plain_http.py").read_text()
    assert "agentjet" not in source.split('"""')[2]  # no import of ours below the docstring
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "math_plain_http.py"), "--server", srv.url,
                          "--limit", "2"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "mean reward" in out.stdout
    assert srv.server.counters.requests.episodes_ended == 4


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq")
def test_curl_example(make_server) -> None:
    srv = make_server(reply="7")
    out = subprocess.run(["bash", str(ROOT / "examples" / "math_curl.sh"), srv.url], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "reward 1" in out.stdout


def test_ajet_run_cli(make_server, tmp_path: Path) -> None:
    srv = make_server(reply="7")
    out = subprocess.run([sys.executable, "-m", "agentjet.cli", "run", str(ROOT / "examples/math_openai_sdk.py:workflow"),
                          "--server", srv.url, "--dataset", str(DATA), "--limit", "2", "--group-size", "2",
                          "--cursor", str(tmp_path / "cursor.json")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "4 episodes, 0 failed" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "agentjet.cli", "run", "nope.py:fn", "--dataset", str(DATA)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "does not exist" in bad.stdout


def test_team_example_trains_two_servers(make_server) -> None:
    import importlib.util

    a = make_server(reply="add them: 7", training={"group_size": 2, "batch_groups": 1})
    b = make_server(reply="7", training={"group_size": 2, "batch_groups": 1})
    spec = importlib.util.spec_from_file_location("team_example", ROOT / "examples" / "team_two_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    asyncio.run(mod.main(a.url, b.url, tasks=3, group_size=2, seed=1))
    for srv in (a, b):  # every team episode committed on both servers
        assert srv.server.reader.count_by_status()["pending"] + srv.server.reader.count_by_status()["trained"] \
            + srv.server.reader.count_by_status()["dropped_uniform"] == 6


def test_team_example_trains_an_adapter_per_role_on_one_server(make_server, tiny_model_path: Path) -> None:
    import importlib.util

    from transformers import AutoTokenizer

    from agentjet.layouts.null import NullAdapters

    roles = ["planner", "executor"]
    engine = NullAdapters(AutoTokenizer.from_pretrained(tiny_model_path), roles, reply="7")
    srv = make_server(engine, learner={"lora": {"rank": 4, "adapters": roles}},
                      training={"group_size": 2, "batch_groups": 1, "drop_uniform_groups": False})
    spec = importlib.util.spec_from_file_location("team_example", ROOT / "examples" / "team_two_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    asyncio.run(mod.main(srv.url, srv.url, tasks=3, group_size=2, seed=1))  # --one-server: both roles, one URL
    wait_until(lambda: all(a.train_steps == 3 for a in srv.server.status().adapters.values()))
    for role in roles:  # each adapter trained on its own role's calls only, once per team episode
        batches = engine.engine(role).learner.trained
        assert sum(len(b) for b in batches) == 6
    held = asyncio.run(_team_eval(mod, srv.url))
    assert set(held) == set(roles)
    assert srv.server.reader.count_by_status()["eval"] == 1  # held out: stored as eval, never trained


async def _team_eval(mod, url: str) -> dict[str, float]:
    from agentjet import Team

    async with Team({"planner": url, "executor": url}) as team:
        return await mod.team_episode(team, {"task_id": "held-1", "a": 3, "b": 4, "answer": "7"}, temperature=0.0,
                                      eval=True)


def test_cocktail_client_resumes_its_cursor(make_server, tmp_path: Path) -> None:
    srv = make_server(reply="APPLE RIVER", training={"task_ratios": {"words": 1.0}})
    cmd = [sys.executable, str(ROOT / "examples" / "cocktail_client.py"), "--server", srv.url, "--tasks", "3",
           "--group-size", "2", "--client-id", "w", "--cursor", str(tmp_path / "c.json")]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and "done: 6 episodes" in first.stdout, first.stderr
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert "done: 0 episodes" in again.stdout  # the cursor remembers finished tasks
    assert "cursor: 3 tasks already done" in again.stdout
