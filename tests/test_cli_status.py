"""`ajet status`: a readable summary (rich tables) of a server's status; `--json` prints the whole answer."""

from __future__ import annotations

import json
import re

import httpx
from rich.console import Console
from tests.conftest import wait_until
from tests.observe.helpers import play_group
from typer.testing import CliRunner

from agentjet.cli import app
from agentjet.cli.status_view import status_view
from agentjet.protocol import BufferCounts, ServerStatus


def _status(**over) -> ServerStatus:
    values = dict(
        model="tiny", engine="vllm+in-process", engine_info={"device": "cuda:0", "dtype": "bfloat16"},
        engine_state="ready", policy_version=3, learner_version=4, weight_push_in_flight=True, train_steps=3,
        buffer=BufferCounts(open_episodes=5, pending_episodes=2, trained_episodes=12, dropped_stale_episodes=1,
                            dropped_uniform_episodes=0, expired_episodes=0, aborted_episodes=0, eval_episodes=4),
        clients=["a", "b"], config={}, weight_syncs=3, weight_sync_failures=1,
        throughput={"uptime_s": 120.0, "calls": 40, "generated_tokens": 1234, "episodes_ended": 14,
                    "calls_per_s": 0.33, "tokens_per_s": 10.3},
        eval_reward={"0": 0.25, "2": 0.5}, task_types={"math": {"episodes": 12, "reward_mean": 0.41}},
        last_train_metrics={"reward_mean": 0.5, "loss": 0.0123, "grad_norm": 1.5, "share/math": 1.0})
    return ServerStatus(**{**values, **over})


def _render(st: ServerStatus, width: int = 100) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(status_view(st))
    return console.export_text()


def test_the_summary_shows_engine_layout_versions_buffers_throughput_and_the_last_step() -> None:
    text = _render(_status())
    for figure in ("vllm+in-process", "cuda:0, bfloat16", "ready", "v3 (learner v4, pushing)", "1,234",
                   "0.33/s", "2.0 min", "3 (1 failed)", "reward_mean", "0.0123", "Task types", "math", "v2"):
        assert figure in text, (figure, text)
    assert re.search(r"trained +12 ", text) and re.search(r"pending +2 ", text)  # each figure beside its name
    assert "share/math" not in text  # the main metrics only


def test_a_served_version_equal_to_the_learners_and_an_older_servers_answer_show_one_version() -> None:
    assert "v3 " in _render(_status(learner_version=3, weight_push_in_flight=False)) + " "
    older = _render(_status(learner_version=None, weight_push_in_flight=False, weight_syncs=None,
                            last_train_metrics={}, task_types={}, eval_reward={}), width=60)
    assert "learner" not in older and "none yet" in older and "weight syncs" not in older


def test_ajet_status_prints_the_summary_and_json_prints_the_answer(make_server, monkeypatch) -> None:
    monkeypatch.delenv("AGENTJET_SWARM_TOKEN", raising=False)
    srv = make_server()  # the null engine: group_size 2, one group per step
    play_group(srv.url, "t1", [1.0, 0.0])
    wait_until(lambda: httpx.get(f"{srv.url}/swarm/v1/status").json()["policy_version"] >= 1)

    result = CliRunner().invoke(app, ["status", "--server", srv.url])
    assert result.exit_code == 0, result.output
    for figure in ("Run", "tiny", "null+null", "policy version", "v1", "train steps", "Episodes", "trained",
                   "Throughput", "chat calls", "Last step (1)", "reward_mean"):
        assert figure in result.output, (figure, result.output)
    assert "{" not in result.output  # no JSON

    result = CliRunner().invoke(app, ["status", "--server", srv.url, "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    answer = httpx.get(f"{srv.url}/swarm/v1/status").json()
    assert printed.keys() == answer.keys() and printed["buffer"] == answer["buffer"]
    assert printed["policy_version"] == 1 and printed["config"] == answer["config"]
    ServerStatus.model_validate(printed)
