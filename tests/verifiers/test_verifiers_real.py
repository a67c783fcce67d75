"""The verifiers runner with the real verifiers 0.4 (opt-in: `make test-verifiers`, which makes .venv-verifiers).

A swarm server on the tiny model; the example taskset (examples/verifiers/ajet_reverse_text) through verifiers'
null harness in the subprocess runtime, its harness program set up by uv. Every episode is acknowledged; its
reward is what the environment's own scorer gives the reply, the reply is what the server generated, and the
policy version moves. The worker refuses every address that is not loopback, so it contacts no cloud (uv, which
sets up the harness program in a child process, reaches PyPI on first use)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.conftest import wait_until

from agentjet.apps.verifiers.bridge import VerifiersWorker, WorkerOptions, resolve_python
from agentjet.apps.verifiers.runner import VerifiersReport, run_verifiers
from agentjet.client.client import SwarmClient

pytestmark = [pytest.mark.verifiers, pytest.mark.server]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "verifiers"
TASKS, GROUP = 4, 2


def scorer() -> Any:
    """The example environment's own scorer, plain Python (its taskset's reward calls it)."""
    spec = importlib.util.spec_from_file_location("ajet_reverse_text_scoring", EXAMPLE / "ajet_reverse_text" / "scoring.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def verifiers_python() -> Path:
    try:
        return resolve_python(ROOT / ".venv-verifiers" / "bin" / "python")
    except Exception as exc:
        pytest.skip(str(exc))


def run(srv: Any, python: Path, log: Path) -> VerifiersReport:
    options = WorkerOptions(taskset="ajet-reverse-text", paths=(EXAMPLE,), limit=TASKS,
                            sampling={"max_tokens": 12}, loopback_only=True)

    async def main() -> VerifiersReport:
        async with SwarmClient(srv.url) as client, VerifiersWorker(options, python=python, log_path=log) as worker:
            assert worker.env_id == "ajet-reverse-text" and len(worker.tasks) == TASKS
            return await run_verifiers(client, worker, concurrency=GROUP)

    return asyncio.run(main())


def generated_text(trace: dict[str, Any], tokenizer: Any) -> str:
    sample = trace["samples"][0]
    (call,) = sample["calls"]
    start, end = call["generated"]
    return str(tokenizer.decode(sample["token_ids"][start:end], skip_special_tokens=True)).strip()


def test_verifiers_episodes_end_with_the_environments_reward(make_server, verifiers_python: Path, tmp_path: Path,
                                                              tiny_model_path: Path) -> None:
    from transformers import AutoTokenizer

    srv = make_server("tiny", admin_token="adm1n", training={"group_size": GROUP, "batch_groups": 1})
    report = run(srv, verifiers_python, tmp_path / "worker.log")
    assert (report.episodes, report.acknowledged, report.failed) == (TASKS * GROUP, TASKS * GROUP, 0), \
        [r.errors for r in report.records]
    score = scorer().score
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    admin = {"Authorization": "Bearer adm1n"}
    for record in report.records:
        assert record.acknowledged and record.calls == 1 and record.reward is not None
        assert record.rewards == {"similarity": {"score": record.reward, "weight": 1.0}}
        assert (record.harness, record.runtime) == ("null", "subprocess")  # AgentJet's defaults, not verifiers'
        stored = httpx.get(f"{srv.url}/swarm/v1/episodes/{record.episode_id}/trace", headers=admin).json()
        reply = generated_text(stored, tokenizer)
        assert reply == record.reply  # verifiers saw what the server generated
        assert score(reply, record.task_name) == pytest.approx(record.reward)  # the environment's own scoring
        assert stored["reward"] == pytest.approx(record.reward)  # ... is what the episode ended with
        prompt = tokenizer.decode(stored["samples"][0]["token_ids"][:stored["samples"][0]["calls"][0]["generated"][0]])
        assert "Reverse the text" in prompt and record.task_name in prompt  # the taskset's prompt went through
    wait_until(lambda: httpx.get(f"{srv.url}/swarm/v1/status").json()["policy_version"] > report.policy_version_before,
               timeout=120)
