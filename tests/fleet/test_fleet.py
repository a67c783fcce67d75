"""The fleet on embedded tiny-model replicas in this process: the router (affinity, least-loaded), a push that
reaches every replica before its version is served, a replica that dies mid-call (the call goes on elsewhere from
its tokens) and one that hangs (out of rotation within the bound, on a fake clock), each coming back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from tests.fleet.conftest import block_worker

from agentjet.engines.base import FinishReason, SamplingParams
from agentjet.generators.fleet import FleetGenerator, ReplicaState, Weights
from agentjet.generators.fleet.counters import RouterCounters
from agentjet.generators.fleet.router import Router
from agentjet.runtime.blocking import run_blocking
from agentjet.runtime.clock import FakeClock
from agentjet.settings import FleetSettings


def make_fleet(replicas, clock=None, **settings) -> FleetGenerator:
    first = replicas[0].generator
    defaults = {"health_interval_s": 60.0, "restart_backoff_s": 0.0, "stall_timeout_s": 5.0}
    fleet = FleetGenerator(first.tokenizer, first.max_context, {first.tokenizer.eos_token_id},
                           FleetSettings(**{**defaults, **settings}), "hf", clock=clock)
    fleet.start(replicas)
    return fleet


def prompt(tok, i: int) -> list[int]:
    return tok.encode(f"episode {i} asks something")


def where(replicas, ids: list[int]) -> list[str]:
    """The replicas whose generator saw a prompt starting with ``ids``."""
    return [r.name for r in replicas if any(p[: len(ids)] == ids for p in r.generator.prompts)]


class _Slot:
    def __init__(self, name: str, in_flight: int = 0) -> None:
        self.name, self.in_flight = name, in_flight


def test_the_router_keeps_a_session_on_its_replica_and_sends_new_ones_to_the_least_loaded() -> None:
    router = Router(RouterCounters())
    a, b = _Slot("a", in_flight=3), _Slot("b", in_flight=1)
    assert router.pick("s1", [a, b]) is b  # the least loaded
    b.in_flight = 9
    assert router.pick("s1", [a, b]) is b  # affinity beats load
    assert router.pick("s2", [a, b]) is a  # a new session: the least loaded now
    assert router.pick("s1", [a]) is a  # its replica left rotation: rebound to another
    assert router.pick("s1", [a, b]) is a  # and it stays there
    assert router.pick(None, [a, b]) is a  # no session: least loaded, remembered nowhere
    c = router.counters
    assert (c.routed, c.affinity_hits, c.new_sessions, c.rebound_sessions) == (6, 2, 3, 1)
    assert (router.sessions_on("a"), router.sessions_on("b")) == (2, 0)
    small = Router(max_sessions=2)
    for s in ("x", "y", "z"):
        small.pick(s, [a])
    assert small.replica_of("x") is None and small.sessions_on("a") == 2  # the oldest is dropped


def test_replicas_serve_calls_and_each_episode_stays_on_one_replica(hf_replicas) -> None:
    replicas = hf_replicas(2)
    fleet = make_fleet(replicas)
    tok = fleet.tokenizer
    params = SamplingParams(max_tokens=4, temperature=1.0)

    async def episode(i: int) -> list:
        return [await fleet.generate_for(f"ep{i}", prompt(tok, i) + tok.encode(f" turn {k}"), params)
                for k in range(3)]

    async def main() -> list:
        return await asyncio.gather(*(episode(i) for i in range(8)))

    results = run_blocking(main())
    assert all(len(r.token_ids) >= 1 for ep in results for r in ep)
    homes = [where(replicas, prompt(tok, i)) for i in range(8)]
    assert all(len(h) == 1 for h in homes), homes  # every call of an episode on one replica
    assert {h[0] for h in homes} == {"r0", "r1"}  # and the episodes spread over both
    assert [len(r.generator.prompts) for r in replicas] == [12, 12]  # the least loaded took each new one
    status = fleet.fleet()
    assert (status.routed_calls, status.affinity_hits, status.new_sessions) == (24, 16, 8)
    assert [r.sessions for r in status.replicas] == [4, 4] and [r.calls for r in status.replicas] == [12, 12]
    run_blocking(fleet.close())


def test_a_push_reaches_every_replica_before_its_version_is_served(hf_replicas, tmp_path: Path) -> None:
    from agentjet.weights.io import export_full  # noqa: F401  (the learner's export format)

    replicas = hf_replicas(2)
    fleet = make_fleet(replicas)
    slow = replicas[1]
    gate = asyncio.Event()
    real_load = slow.load

    async def gated(weights: Weights) -> None:
        await gate.wait()
        await real_load(weights)

    slow.load = gated
    weights = Weights(1, Path(replicas[0].generator.inner.model_path))  # the same weights, as version 1
    pushing = fleet.loop.submit(fleet.slots.push(weights))
    deadline = time.monotonic() + 30
    while replicas[0].version != 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert (replicas[0].version, replicas[1].version) == (1, 0)
    assert fleet.policy_version == 0  # one replica holds v1: not served yet
    fleet.loop.soon(gate.set)
    metrics = pushing.result(timeout=30)
    assert fleet.policy_version == 1 and [r.version for r in replicas] == [1, 1]
    assert metrics["replicas_pushed"] == 2 and metrics["replica_push_failures"] == 0
    status = fleet.fleet()
    assert [r.pushes for r in status.replicas] == [1, 1] and all(r.last_push_s > 0 for r in status.replicas)
    assert status.replicas[1].last_push_s >= status.replicas[0].last_push_s  # each timed on its own
    run_blocking(fleet.close())


def test_a_push_that_fails_on_one_replica_takes_it_out_and_it_catches_up_when_back(hf_replicas) -> None:
    replicas = hf_replicas(2)
    fleet = make_fleet(replicas)
    broken = replicas[1]
    real_load = broken.load
    fails = [1]

    async def flaky(weights: Weights) -> None:
        if fails[0]:
            fails[0] -= 1
            raise OSError("no space left on device")
        await real_load(weights)

    broken.load = flaky
    weights = Weights(1, Path(replicas[0].generator.inner.model_path))
    metrics = run_blocking(fleet.push(weights))  # not raised: one replica took it
    assert metrics["replicas_pushed"] == 1 and metrics["replica_push_failures"] == 1
    deadline = time.monotonic() + 30
    while fleet.fleet().replicas[1].state != "serving":  # restarted and caught up
        assert time.monotonic() < deadline, fleet.fleet()
        time.sleep(0.02)
    status = fleet.fleet().replicas[1]
    assert status.policy_version == 1 and status.restarts == 1 and status.push_failures == 1
    assert "push of policy v1 failed" in status.out_reason
    assert fleet.policy_version == 1
    run_blocking(fleet.close())


def test_a_replica_that_dies_mid_call_hands_its_call_on_with_its_tokens_and_comes_back(hf_replicas) -> None:
    replicas = hf_replicas(2)
    fleet = make_fleet(replicas)
    tok = fleet.tokenizer
    fleet.slots.router.pick("ep", fleet.slots.serving())  # the episode is on r0 ...
    assert fleet.slots.router.replica_of("ep") == "r0"
    replicas[0].generator.fail_after = 3  # ... which dies after 3 tokens of its next call
    replicas[0].alive = lambda: not replicas[0].generator.dead
    streamed: list[int] = []
    params = SamplingParams(max_tokens=12, temperature=1.0)
    ids = prompt(tok, 0)
    result = run_blocking(fleet.generate_for("ep", ids, params, on_token=lambda t, lp: streamed.append(t)))
    first = replicas[0].generator.prompts[-1]
    second = replicas[1].generator.prompts[-1]
    assert first == ids and second[: len(ids)] == ids and len(second) == len(ids) + 3  # went on from 3 tokens
    assert result.token_ids[:3] == second[len(ids):]  # the tokens kept are the reply's first
    assert streamed == result.token_ids  # the client's stream saw each token once, in order
    assert len(result.logprobs) == len(result.token_ids) == len(result.versions)
    assert fleet.slots.router.replica_of("ep") == "r1"  # the episode's later calls stay on r1
    status = fleet.fleet()
    assert (status.failovers, status.failover_tokens, status.rebound_sessions) == (1, 3, 1)
    assert status.replicas[0].failed_calls == 1 and status.replicas[1].calls == 1
    replicas[0].generator.fail_after = None
    replicas[0].generator.dead = False  # its restart brings back a working process
    deadline = time.monotonic() + 30
    while fleet.fleet().replicas[0].state != "serving":
        assert time.monotonic() < deadline, fleet.fleet()
        time.sleep(0.02)
    assert fleet.fleet().replicas[0].restarts == 1
    run_blocking(fleet.close())


def test_a_hung_replica_is_out_of_rotation_within_the_bound_and_its_call_completes_elsewhere(hf_replicas) -> None:
    clock = FakeClock()
    replicas = hf_replicas(2)
    fleet = make_fleet(replicas, clock=clock, stall_timeout_s=5.0)
    tok = fleet.tokenizer
    fleet.slots.router.pick("ep", fleet.slots.serving())
    release = block_worker(replicas[0].generator)  # r0's engine thread hangs
    params = SamplingParams(max_tokens=6, temperature=1.0)
    call = fleet.loop.submit(fleet.calls.generate("ep", prompt(tok, 1), params, None, None))
    deadline = time.monotonic() + 10
    while not replicas[0].generator.prompts:  # the call is on r0, which owes it
        assert time.monotonic() < deadline
        time.sleep(0.01)
    clock.advance(4.9)
    fleet.check()
    assert fleet.fleet().replicas[0].state == "serving"  # within the bound: still in
    clock.advance(0.1)
    fleet.check()
    status = fleet.fleet().replicas[0]
    assert status.state in ("out", "restarting") and status.out_reason.startswith("hung")
    result = call.result(timeout=30)  # the call went on on r1
    assert result.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) and replicas[1].generator.prompts
    release.set()  # the engine thread comes back: the restart (a ping answered) puts r0 back
    deadline = time.monotonic() + 30
    while fleet.fleet().replicas[0].state != "serving":
        assert time.monotonic() < deadline, fleet.fleet()
        time.sleep(0.02)
    run_blocking(fleet.close())


def test_an_idle_replica_that_stops_answering_its_ping_is_out_within_the_bound(hf_replicas) -> None:
    clock = FakeClock()
    replicas = hf_replicas(2)
    fleet = make_fleet(replicas, clock=clock, stall_timeout_s=5.0)
    release = block_worker(replicas[1].generator)
    fleet.check()  # the idle replicas are pinged; r1's ping is never answered
    time.sleep(0.2)
    clock.advance(5.0)
    fleet.check()
    states = [r.state for r in fleet.fleet().replicas]
    assert states[0] == "serving" and states[1] in ("out", "restarting")
    release.set()
    run_blocking(fleet.close())


@pytest.mark.parametrize("n", [0])
def test_no_replica_in_rotation_is_a_503_after_the_wait(n: int, hf_replicas) -> None:
    from agentjet.engines.errors import EngineUnavailableError

    replicas = hf_replicas(1)
    fleet = make_fleet(replicas, startup_timeout_s=0.5, max_restarts=0)
    fleet.loop.run(_take_out(fleet))
    with pytest.raises(EngineUnavailableError, match="no generator replica is in rotation"):
        run_blocking(fleet.generate(prompt(fleet.tokenizer, 0), SamplingParams(max_tokens=2)))
    assert fleet.fleet().unavailable == 1 and fleet.fleet().replicas[0].state == ReplicaState.FAILED.value
    run_blocking(fleet.close())


async def _take_out(fleet: FleetGenerator) -> None:
    fleet.slots.take_out(fleet.slots.all()[0], "test")
    await asyncio.sleep(0.05)
