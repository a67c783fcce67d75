"""The control plane: admin token, live settings applied at the right version, pause/resume, checkpoint, stop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import httpx
import pytest
from tests.conftest import settle, wait_until

from agentjet import SwarmClient
from agentjet.layouts.null import NullGenerator, NullLearner, compose_null
from agentjet.protocol import PauseState

ADMIN = {"Authorization": "Bearer adm1n"}
USER = [{"role": "user", "content": "hi"}]


async def group(client: SwarmClient, task: str, rewards=(1.0, 0.0)) -> None:
    async def one(r: float) -> None:
        async with client.episode(task_id=task) as ep:
            await ep.openai().chat.completions.create(model="x", messages=USER)
            ep.reward(r)

    await asyncio.gather(*[one(r) for r in rewards])


def test_control_needs_the_admin_token(make_server) -> None:
    srv = make_server(admin_token="adm1n")
    for method, path in (("GET", "config"), ("POST", "config"), ("POST", "pause"), ("POST", "resume"),
                         ("POST", "checkpoint"), ("POST", "stop")):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = httpx.request(method, f"{srv.url}/swarm/v1/control/{path}", json={}, headers=headers)
            assert r.status_code == 401, (path, r.text)
            assert "admin token" in r.json()["error"]["message"]
    assert srv._thread.is_alive()


def test_live_settings_take_effect_from_the_next_batch(make_server) -> None:
    srv = make_server(admin_token="adm1n", training={"group_size": 2, "batch_groups": 1})

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            await group(client, "a")
            await asyncio.to_thread(wait_until, lambda: srv.server.counters.training.train_steps == 1)
            rates: list[float] = []
            srv.server.engine.set_learning_rate = rates.append  # the learner is told the new rate
            r = httpx.post(f"{srv.url}/swarm/v1/control/config", headers=ADMIN, json={
                "training": {"group_size": 3}, "learner": {"learning_rate": 0.02}, "sampling": {"temperature": 0.5}})
            assert r.status_code == 200, r.text
            rec = r.json()
            assert rec["policy_version"] == 1 and rec["train_step"] == 1
            assert rec["changes"] == {"training.group_size": 3, "learner.learning_rate": 0.02,
                                      "sampling.temperature": 0.5}
            assert srv.server.config.learner.learning_rate == 0.02 and rates == [0.02]
            await group(client, "b", (1.0, 0.0))  # only 2 of the 3 now needed: no step
            await asyncio.to_thread(settle, srv)
            assert srv.server.counters.training.train_steps == 1
            await group(client, "b", (0.5,))
            await asyncio.to_thread(wait_until, lambda: srv.server.counters.training.train_steps == 2)

    asyncio.run(main())
    assert len(srv.server.engine.learner.trained[1]) == 3
    log = httpx.get(f"{srv.url}/swarm/v1/control/config", headers=ADMIN).json()
    assert log["config"]["training"]["group_size"] == 3 and log["changes"][0]["policy_version"] == 1


def test_invalid_settings_change_nothing(make_server) -> None:
    srv = make_server(admin_token="adm1n")
    before = srv.server.config.training.model_dump()
    for body, fragment in (({"training": {"group_size": 0}}, "group_size"),
                           ({"training": {"group_size": 8, "learning_rate": -1}}, "learning_rate"),
                           ({"training": {"warp_speed": 9}}, "warp_speed"),
                           ({"training": {"min_group_size": 9}}, "min_group_size"),
                           ({"nonsense": {}}, "nonsense"),
                           # the learning rate left training: the old key is refused naming the new one
                           ({"training": {"learning_rate": 0.02}},
                            "training.learning_rate moved to learner.learning_rate"),
                           # live-ness is a setting's, not its section's: the learner's others need a restart
                           ({"learner": {"learning_rate": 0.02, "weight_decay": 0.1}},
                            "learner.weight_decay cannot change while the server runs")):
        r = httpx.post(f"{srv.url}/swarm/v1/control/config", json=body, headers=ADMIN)
        assert r.status_code == 400, r.text
        assert fragment in r.json()["error"]["message"]
    assert srv.server.config.training.model_dump() == before  # all or nothing
    assert srv.server.config.learner.learning_rate == 1e-3


def test_pause_resume_and_checkpoint(make_server) -> None:
    srv = make_server(admin_token="adm1n", training={"group_size": 2, "batch_groups": 1})

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            assert httpx.post(f"{srv.url}/swarm/v1/control/pause", headers=ADMIN).json()["paused"] is True
            await group(client, "a")
            await asyncio.to_thread(settle, srv)
            assert srv.server.counters.training.train_steps == 0  # episodes wait in the store
            assert srv.server.status().engine_state == "paused"
            httpx.post(f"{srv.url}/swarm/v1/control/resume", headers=ADMIN)
            await asyncio.to_thread(wait_until, lambda: srv.server.counters.training.train_steps == 1)

    asyncio.run(main())
    ck = httpx.post(f"{srv.url}/swarm/v1/control/checkpoint", headers=ADMIN).json()
    assert ck["train_step"] == 1 and (srv.server.config.data_dir / "checkpoints" / "step-000001").is_dir()


def test_ajet_ctl_cli(make_server) -> None:
    srv = make_server(admin_token="adm1n")

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentjet.cli", "ctl", *args, "--server", srv.url,
                               "--token", "adm1n"], capture_output=True, text=True, timeout=60)

    out = ctl("set", "learning_rate=3e-5", "max_staleness=2", "temperature=0.8")
    assert out.returncode == 0, out.stdout + out.stderr
    assert srv.server.config.training.max_staleness == 2 and srv.server.config.sampling.temperature == 0.8
    assert srv.server.config.learner.learning_rate == 3e-5
    out = ctl("set", "lr=4e-5", "learner.learning_rate=4e-5")  # the alias and the new dotted key
    assert out.returncode == 0 and srv.server.config.learner.learning_rate == 4e-5, out.stdout + out.stderr
    old = ctl("set", "training.learning_rate=5e-5")  # today's dotted key: refused with the new one
    assert old.returncode == 2 and "moved to learner.learning_rate" in " ".join((old.stdout + old.stderr).split())
    fixed = ctl("set", "weight_decay=0.1")  # in a section with a live setting, but not live itself
    assert fixed.returncode == 2 and "learner.weight_decay cannot change" in " ".join((fixed.stdout + fixed.stderr).split())
    bad = ctl("set", "group_size=-3")
    assert bad.returncode == 2 and "training.group_size (--group-size)" in bad.stdout + bad.stderr
    out = ctl("stop")
    assert out.returncode == 0
    wait_until(lambda: not srv._thread.is_alive(), timeout=30)


def test_loss_objective_settings_are_live(make_server) -> None:
    """The objective settings change through the control plane like the other loss settings; Dr. GRPO's
    unscaled advantages reach the next batch; an out-of-band correction bound is refused, naming the field."""
    srv = make_server(admin_token="adm1n", training={"group_size": 2, "batch_groups": 1})

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            await group(client, "a")
            await asyncio.to_thread(wait_until, lambda: srv.server.counters.training.train_steps == 1)
            rates: list[float] = []
            srv.server.engine.set_learning_rate = rates.append  # the learner is told the new rate
            r = httpx.post(f"{srv.url}/swarm/v1/control/config", headers=ADMIN, json={"loss": {
                "objective": "cispo", "aggregation": "seq_mean", "ratio_level": "sequence", "scale_by_std": False,
                "correction": "mask_sequence", "correction_low": 0.8, "kl_estimator": "k2"}})
            assert r.status_code == 200, r.text
            bad = httpx.post(f"{srv.url}/swarm/v1/control/config", headers=ADMIN,
                             json={"loss": {"correction_low": 1.5}})
            assert bad.status_code == 400 and "correction_low" in bad.json()["error"]["message"]
            await group(client, "b")
            await asyncio.to_thread(wait_until, lambda: srv.server.counters.training.train_steps == 2)

    asyncio.run(main())
    cfg = srv.server.config.loss.policy_loss_config()
    assert (cfg.objective, cfg.aggregation, cfg.ratio_level, cfg.correction, cfg.correction_low,
            cfg.kl_estimator) == ("cispo", "seq_mean", "sequence", "mask_sequence", 0.8, "k2")
    first = sorted({a for s in srv.server.engine.learner.trained[0] for a in s.advantages if a})
    second = sorted({a for s in srv.server.engine.learner.trained[1] for a in s.advantages if a})
    assert first[1] == -first[0] and abs(first[1] - 2 ** -0.5) < 1e-5  # divided by the std of (1, 0)
    assert second == [-0.5, 0.5]  # rewards 1 and 0, mean-centred only


class GatedLearner(NullLearner):
    """A train step that runs until the test opens its gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    async def train_step(self, batch):
        await asyncio.to_thread(self.gate.wait, 60)
        return await super().train_step(batch)


@pytest.mark.parametrize("wait_for_step", [True, False])
def test_pause_can_wait_for_the_step_in_progress(make_server, tiny_model_path, wait_for_step: bool) -> None:
    """With ``wait_for_step`` the answer comes after the step that was running when the pause arrived (the
    answer's train_steps is 1); without it, at once (0), and the step still finishes. No step starts after."""
    from transformers import AutoTokenizer

    learner = GatedLearner()
    engine = compose_null(NullGenerator(AutoTokenizer.from_pretrained(tiny_model_path)), learner)
    srv = make_server(engine, admin_token="adm1n", training={"group_size": 2, "batch_groups": 1})
    loop, pool, counters = srv.server.train_loop, srv.server.pool, srv.server.counters.training
    entered = threading.Event()
    original = loop.pause

    async def pause(wait_for_step: bool = False) -> None:
        entered.set()  # the pause request is being served, the step is still held at the gate
        await original(wait_for_step)

    loop.pause = pause  # type: ignore[method-assign]

    async def main() -> PauseState:
        async with SwarmClient(srv.url) as client:
            await group(client, "a")
            await asyncio.to_thread(wait_until, lambda: pool.in_step == 2)  # the step is running
            paused = asyncio.create_task(client.pause(wait_for_step=wait_for_step, admin_token="adm1n"))
            await asyncio.to_thread(entered.wait, 30)
            learner.gate.set()
            state = await paused
            await group(client, "b")  # a full batch arrives while paused: it waits
            return state

    state = asyncio.run(main())
    assert state.paused and state.train_steps == (1 if wait_for_step else 0)
    wait_until(lambda: counters.train_steps == 1)
    settle(srv)
    assert counters.train_steps == 1 and pool.pending_count == 2
