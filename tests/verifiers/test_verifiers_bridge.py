"""The verifiers runner without verifiers (CI): the worker's overrides of verifiers' defaults and what it makes of
an episode, the command and environment it is started with, and, through a real swarm server on the null engine
with a stand-in worker, that each episode ends with the environment's reward, a failed one is aborted, and the
policy version moves. The real verifiers runs in the opt-in `make test-verifiers` (test_verifiers_real.py)."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import httpx
import pytest
from tests.conftest import wait_until

from agentjet.apps.verifiers.bridge import (
    WORKER,
    EpisodeOutcome,
    VerifiersEpisodeError,
    VerifiersTask,
    WorkerError,
    WorkerOptions,
    resolve_python,
    worker_command,
    worker_env,
)
from agentjet.apps.verifiers.runner import run_verifiers, swarm_tasks
from agentjet.client.client import SwarmClient


def load_worker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ajet_vf_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_worker_imports_only_the_standard_library_and_verifiers() -> None:
    """It runs in the verifiers venv (openai<3), where neither AgentJet nor its dependencies are installed."""
    tree = ast.parse(WORKER.read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert roots - set(sys.stdlib_module_names) - {"__future__"} == {"verifiers"}


def test_every_role_gets_the_null_harness_and_the_subprocess_runtime_unless_pinned() -> None:
    worker = load_worker()
    args = worker.parse_args(["--socket", "s", "--taskset", "my-taskset",
                              "--env-config", '{"judge": {"runtime": {"type": "docker"}}, "max_concurrent_agents": 2}'])
    data = worker.env_config_data(args, ["solver", "judge"])
    assert data["taskset"] == {"id": "my-taskset"} and data["max_concurrent_agents"] == 2
    assert data["solver"] == {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}
    assert data["judge"] == {"harness": {"id": "null"}, "runtime": {"type": "docker"}}  # pinned: kept


def _trace(reward: float | None, ok: bool = True, reply: str = "elppa") -> SimpleNamespace:
    rewards = {} if reward is None else {"similarity": SimpleNamespace(score=reward, weight=1.0)}
    agent = SimpleNamespace(name="agent", config=SimpleNamespace(harness=SimpleNamespace(id="null")),
                            runtime=SimpleNamespace(type="subprocess"))
    return SimpleNamespace(agent=agent, reward=reward, rewards=rewards, last_reply=reply,
                           ok=ok, errors=[])


def test_the_episode_reward_is_the_traces_reward() -> None:
    worker = load_worker()
    episode = SimpleNamespace(ok=True, traces=[_trace(0.8)], errors=[])
    assert worker.describe_episode(episode) == {
        "ok": True, "reward": 0.8, "errors": [],
        "traces": [{"agent": "agent", "harness": "null", "runtime": "subprocess", "reward": 0.8, "rewards": {"similarity": {"score": 0.8, "weight": 1.0}},
                    "reply": "elppa", "ok": True, "errors": []}]}
    failed = SimpleNamespace(ok=False, traces=[_trace(None, ok=False)],
                             errors=[SimpleNamespace(type="EnvError", message="boom")])
    described = worker.describe_episode(failed)
    assert described["ok"] is False and described["reward"] is None and described["errors"] == ["EnvError: boom"]
    with pytest.raises(VerifiersEpisodeError, match="boom"):
        EpisodeOutcome.from_reply(described).require_reward()


def test_worker_command_and_environment(tmp_path: Path) -> None:
    python = tmp_path / "venv" / "bin" / "python"
    options = WorkerOptions(taskset="t", env_id="best-of-n", paths=(tmp_path,), limit=3,
                            sampling={"max_tokens": 8}, loopback_only=True)
    argv = worker_command(python, tmp_path / "s.sock", options)
    assert argv[:2] == [str(python), str(WORKER)]
    flags = " ".join(argv[2:])
    for part in ("--taskset t", "--harness null", "--runtime subprocess", "--env-id best-of-n", f"--path {tmp_path}",
                 "--limit 3", '--sampling {"max_tokens": 8}', "--loopback-only"):
        assert part in flags
    env = worker_env(python, {"PATH": "/usr/bin", "PRIME_API_KEY": "x", "HOME": "/h"})
    assert env["PATH"].split(":")[0] == str(python.parent)  # the venv's uv sets up the harness program
    assert "PRIME_API_KEY" not in env and env["HOME"] == "/h"
    with pytest.raises(WorkerError, match="make setup-verifiers"):
        resolve_python(tmp_path / "nope" / "python")


def test_task_ids_are_stable_per_environment_and_task() -> None:
    tasks = [VerifiersTask(0, "k0", "a", "apple"), VerifiersTask(1, "k1", "b", "river")]
    first, again = swarm_tasks("env", tasks), swarm_tasks("env", list(reversed(tasks)))
    assert {t["task_id"] for t in first} == {t["task_id"] for t in again}
    assert first[0]["task_type"] == "env" and first[0]["index"] == 0
    assert swarm_tasks("other", tasks)[0]["task_id"] != first[0]["task_id"]


class StandInWorker:
    """The worker's interface, scoring by a table: task 3 fails in verifiers."""

    env_id = "stand-in"
    verifiers_version = "0.4.0"
    tasks = [VerifiersTask(i, f"k{i}", f"t{i}", f"task{i}") for i in range(4)]

    def __init__(self) -> None:
        self.calls = 0
        self.seen: list[tuple[int, str]] = []

    async def episode(self, index: int, base_url: str, api_key: str) -> EpisodeOutcome:
        self.calls += 1
        nth = self.calls  # taken before the await: the two episodes of a group run at once
        self.seen.append((index, base_url))
        async with httpx.AsyncClient() as http:  # the agent's one call, with the episode's key
            r = await http.post(f"{base_url}/chat/completions", headers={"Authorization": f"Bearer {api_key}"},
                                json={"model": "agent", "messages": [{"role": "user", "content": f"task {index}"}]})
            r.raise_for_status()
        if index == 3:
            return EpisodeOutcome(ok=False, reward=None, traces=[], errors=["HarnessError: exit 1"])
        reward = 0.25 * index + 0.1 * (nth % 2)  # differs inside each group, so groups train
        return EpisodeOutcome(ok=True, reward=reward, traces=[{"reward": reward, "reply": "ok", "rewards": {}}],
                              errors=[])


def test_each_episode_ends_with_the_environments_reward(make_server) -> None:
    srv = make_server("null", admin_token="adm1n", training={"group_size": 2, "batch_groups": 1})
    worker = StandInWorker()

    async def main() -> Any:
        async with SwarmClient(srv.url) as client:
            return await run_verifiers(client, worker, concurrency=2)  # type: ignore[arg-type]

    report = asyncio.run(main())
    assert (report.episodes, report.acknowledged, report.failed) == (8, 6, 2)
    assert all(url == f"{srv.url}/v1" for _, url in worker.seen)
    admin = {"Authorization": "Bearer adm1n"}
    for record in report.records:
        if record.task_index == 3:  # verifiers failed: the swarm episode was aborted, so nothing is stored
            assert not record.acknowledged and record.errors == ["HarnessError: exit 1"]
            assert httpx.get(f"{srv.url}/swarm/v1/episodes/{record.episode_id}/trace", headers=admin).status_code == 404
            continue
        stored = httpx.get(f"{srv.url}/swarm/v1/episodes/{record.episode_id}/trace", headers=admin).json()
        assert record.acknowledged and record.calls == 1
        assert stored["reward"] == pytest.approx(record.reward)
    wait_until(lambda: httpx.get(f"{srv.url}/swarm/v1/status").json()["policy_version"] > report.policy_version_before)


def test_serving_restarts_after_its_episodes_when_none_runs() -> None:
    """verifiers keeps one HTTP client per key for as long as its serving resources live; the worker restarts
    them every ``recycle_every`` episodes, and never under a running one."""
    import contextlib

    worker = load_worker()
    events: list[str] = []

    class FakeEnv:
        @contextlib.asynccontextmanager
        async def serving(self):
            events.append("up")
            yield
            events.append("down")

    async def main() -> None:
        async with worker.Serving(FakeEnv(), recycle_every=2) as serving:
            release = asyncio.Event()

            async def episode(name: str, wait: bool) -> None:
                async with serving.slot():
                    events.append(name)
                    if wait:
                        await release.wait()

            first = asyncio.create_task(episode("e1", wait=True))
            await asyncio.sleep(0)
            await episode("e2", wait=False)
            third = asyncio.create_task(episode("e3", wait=False))  # the third waits until e1 is done
            await asyncio.sleep(0.05)
            assert events == ["up", "e1", "e2"]
            release.set()
            await asyncio.gather(first, third)

    asyncio.run(main())
    assert events == ["up", "e1", "e2", "down", "up", "e3", "down"]


def test_loopback_only_refuses_other_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setattr(socket, "getaddrinfo", socket.getaddrinfo)  # restored after the test
    load_worker().guard_loopback()
    assert socket.getaddrinfo("127.0.0.1", 80)
    with pytest.raises(OSError, match="loopback only"):
        socket.getaddrinfo("93.184.216.34", 443)  # an address: no lookup leaves the machine
