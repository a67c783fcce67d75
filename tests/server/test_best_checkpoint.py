"""The best checkpoint kept (issue 38): a client's held-out eval pins the step's checkpoint as the run's best; the
pin only moves up, survives pruning and restarts, and ``ajet export --best`` finds it."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import httpx
import pytest
from tests.server.test_read_model import _Versioned

from agentjet import SwarmClient
from agentjet.apps.export import ExportError, find_checkpoint
from agentjet.client.scheduled import run_scheduled
from agentjet.client.settings import RunSettings
from agentjet.runtime.clock import FakeClock
from agentjet.server.counters import TrainingCounters
from agentjet.server.store import SQLiteStore
from agentjet.server.training.checkpoints import Checkpoints
from agentjet.settings import ServerConfig, TrainingSettings
from agentjet.tasks import addition
from agentjet.weights import checkpoints as layout

ADMIN = {"Authorization": "Bearer adm1n"}


def _checkpoints(root: Path, counters: TrainingCounters, keep: int) -> Checkpoints:
    config = ServerConfig(training=TrainingSettings(keep_checkpoints=keep))
    return Checkpoints(root, _Versioned(), SQLiteStore(root.parent / "store.sqlite"), counters, lambda: config,
                       FakeClock())


def _step(ck: Checkpoints, counters: TrainingCounters, step: int) -> None:
    counters.stepped(step, episodes=2, samples=2, tokens=10, metrics={}, version=step)
    ck.engine.policy_version = step  # type: ignore[misc]


def test_the_pin_moves_only_up_writes_a_checkpoint_only_when_it_moves_and_survives_pruning(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    counters = TrainingCounters()
    ck = _checkpoints(root, counters, keep=1)
    _step(ck, counters, 1)
    first = ck.pin_best(0.5)
    assert first.moved and first.path == layout.step_dir(root, 1) and layout.is_complete(first.path)
    assert layout.best(root)["eval"] == 0.5 and layout.best(root)["policy_version"] == 1

    _step(ck, counters, 2)
    lower = ck.pin_best(0.4)  # a worse eval: nothing written, the pin stays
    assert not lower.moved and lower.path == first.path and not layout.step_dir(root, 2).exists()
    equal = ck.pin_best(0.5)  # not better either
    assert not equal.moved and layout.best(root)["train_steps"] == 1

    _step(ck, counters, 3)
    ck.save()  # a periodic checkpoint of step 3; with keep_checkpoints 1 the pinned step 1 stays beside it
    assert [p.name for p in layout.step_dirs(root)] == ["step-000001", "step-000003"]
    saved_at = (layout.step_dir(root, 3) / layout.SERVER_STATE).stat().st_mtime_ns
    higher = ck.pin_best(0.75)  # step 3 has its checkpoint already: pinned, not written again
    assert higher.moved and higher.path == layout.step_dir(root, 3)
    assert (layout.step_dir(root, 3) / layout.SERVER_STATE).stat().st_mtime_ns == saved_at
    assert [p.name for p in layout.step_dirs(root)] == ["step-000003"]  # the old pin was pruned once it moved

    again = _checkpoints(root, counters, keep=1)  # a restarted server (or client) reads the same pin
    assert not again.pin_best(0.6).moved and again.best()["eval"] == 0.75


def test_a_torn_or_dangling_pin_counts_as_none(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / layout.BEST).write_text("{not json")
    assert layout.best(root) is None
    (root / layout.BEST).write_text(json.dumps({"checkpoint": "step-000004", "eval": 1.0}))
    assert layout.best(root) is None  # names no complete checkpoint
    (root / layout.BEST).write_text(json.dumps({"checkpoint": "../elsewhere", "eval": 1.0}))
    assert layout.best(root) is None


def test_the_control_route_pins_by_eval_and_refuses_a_bad_body(make_server) -> None:
    srv = make_server(admin_token="adm1n")
    url = f"{srv.url}/swarm/v1/control/checkpoint"
    first = httpx.post(url, headers=ADMIN, json={"best_eval": 0.5}).json()
    assert first["pinned"] and first["best"]["eval"] == 0.5 and first["best"]["train_steps"] == 0
    worse = httpx.post(url, headers=ADMIN, json={"best_eval": 0.25}).json()
    assert not worse["pinned"] and worse["best"]["eval"] == 0.5 and worse["path"] == first["path"]
    plain = httpx.post(url, headers=ADMIN).json()  # a plain checkpoint reports the pin too
    assert not plain["pinned"] and plain["best"]["path"] == first["path"]
    for body, field in (({"best_eval": "high"}, "best_eval"), ({"best_eval": 0.5, "tag": "x"}, "tag")):
        r = httpx.post(url, headers=ADMIN, json=body)
        assert r.status_code == 400 and field in r.json()["error"]["message"], r.text
    r = httpx.post(url, headers=ADMIN, content=b'{"best_eval": NaN}')
    assert r.status_code == 400, r.text
    assert layout.best(srv.server.config.data_dir / "checkpoints")["eval"] == 0.5  # nothing changed it


def test_a_scheduled_run_with_keep_best_ends_with_its_best_eval_pinned(make_server) -> None:
    """The evals go 0.25, 0.75, then 0.5 for the rest: the step evaluated at 0.75 stays pinned, and export finds it."""
    srv = make_server(reply="7", admin_token="adm1n", training={"group_size": 2, "batch_groups": 1,
                                                                "keep_checkpoints": 1})
    pool = [addition.make_task(a, b) for a, b in [(3, 4), (5, 2), (1, 1)]]
    evals = [addition.make_task(0, 7, "eval"), addition.make_task(1, 2, "eval")]
    rewards = itertools.cycle([1.0, 0.0])  # mixed groups: the null learner steps
    eval_calls = itertools.count()

    async def train(task, ep) -> float:  # noqa: ANN001
        await ep.openai().chat.completions.create(model="m", messages=task["messages"], max_tokens=4)
        return next(rewards)

    async def evaluate(task, ep) -> float:  # noqa: ANN001
        await ep.openai().chat.completions.create(model="m", messages=task["messages"], max_tokens=4)
        return [0.25, 0.75][n] if (n := next(eval_calls) // len(evals)) < 2 else 0.5

    async def main():
        async with SwarmClient(srv.url, token="adm1n") as client:
            return await run_scheduled(client, train, evaluate, pool, evals,
                                       RunSettings(group_size=2, concurrency=4, time_budget_s=3.0,
                                                   eval_every_s=1.0, poll_s=0.1, keep_best=True))

    run = asyncio.run(main())
    assert [e.reward for e in run.evals][:3] == [0.25, 0.75, 0.5] and len(run.evals) >= 3
    root = srv.server.config.data_dir / "checkpoints"
    pin = layout.best(root)
    assert pin is not None and pin["eval"] == 0.75 and pin["train_steps"] == run.evals[1].train_steps
    assert run.best is not None and run.best.eval == 0.75 and run.best.path == str(root / pin["checkpoint"])
    assert run.evals[-1].train_steps > run.evals[1].train_steps  # it trained on after its best
    assert find_checkpoint(srv.server.config.data_dir, best=True).step == run.evals[1].train_steps
    with pytest.raises(ExportError, match="one of --step, --version and --best"):
        find_checkpoint(srv.server.config.data_dir, step=1, best=True)


def test_keep_best_without_the_admin_token_warns_and_the_run_goes_on(make_server, caplog) -> None:
    srv = make_server(reply="7", admin_token="adm1n")
    evals = [addition.make_task(0, 7, "eval")]

    async def answer(task, ep) -> float:  # noqa: ANN001
        await ep.openai().chat.completions.create(model="m", messages=task["messages"], max_tokens=4)
        return 1.0

    async def main():
        async with SwarmClient(srv.url) as client:  # no admin token: no pause, so no pin
            return await run_scheduled(client, answer, answer, [addition.make_task(1, 1)], evals,
                                       RunSettings(group_size=2, concurrency=2, time_budget_s=0.5,
                                                   eval_every_s=None, poll_s=0.1, keep_best=True))

    run = asyncio.run(main())
    assert len(run.evals) == 2 and run.best is None
    assert layout.best(srv.server.config.data_dir / "checkpoints") is None
    assert "not pinning the best checkpoint" in caplog.text
    with pytest.raises(ExportError, match="no best checkpoint pinned"):
        find_checkpoint(srv.server.config.data_dir, best=True)
