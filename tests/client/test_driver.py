"""The train → pause → evaluate driver (``agentjet.client.driver``) on a fake clock.

Most tests use an in-memory client whose "server" takes one train step per status poll while it is not paused,
so step counts are exact; the clock moves only by the driver's own waits and by what a test advances it. The last test drives a real server (null engine)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from agentjet import SwarmClient
from agentjet.client.client import SwarmError
from agentjet.client.driver import Driver, Stop, held_out
from agentjet.client.runner import begin_unless_stopped, run_workflow
from agentjet.client.settings import RunSettings
from agentjet.protocol import PauseState
from agentjet.runtime.clock import FakeClock
from agentjet.tasks import addition

TASKS = [{"task_id": f"t{i}"} for i in range(4)]
EVAL_TASKS = [{"task_id": f"e{i}"} for i in range(2)]


@dataclass
class _Status:
    train_steps: int
    policy_version: int
    last_train_metrics: dict[str, float | None] = field(default_factory=dict)


class FakeEpisode:
    def __init__(self, server: FakeServer, task_id: str, eval: bool) -> None:
        self.server, self.task_id, self.eval = server, task_id, eval
        self.result = None
        self.policy_version = server.train_steps

    def reward(self, value: float) -> None:
        pass

    async def begin(self) -> FakeEpisode:
        self.server.log.append(("begin", self.eval, self.server.stopped()))
        return self

    async def __aenter__(self) -> FakeEpisode:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


class FakeServer:
    """An in-memory SwarmClient and its server: one train step per status poll while not paused. Records pause,
    resume, episode begins and what each eval episode saw. A training workflow takes ``turns`` turns of the
    event loop (0: it finishes at once, so no pause waits for one)."""

    def __init__(self, refuse_pause: bool = False, turns: int = 0) -> None:
        self.train_steps = 0
        self.turns = turns
        self.paused = False
        self.refuse_pause = refuse_pause
        self.running = 0  # training workflows between their first and last line
        self.log: list[tuple[Any, ...]] = []
        self.stopped = lambda: False

    # the client's API as the driver and the runner use it
    def group_size(self, requested: int | None = None) -> int:
        return requested or 1

    async def status(self) -> _Status:
        if not self.paused:
            self.train_steps += 1
        return _Status(self.train_steps, self.train_steps, {"loss": None, "reward_mean": 1.0})

    async def pause(self, wait_for_step: bool = True, *, admin_token: str | None = None) -> PauseState:
        if self.refuse_pause:
            raise SwarmError(403, "an admin token is required")
        self.paused = True
        self.log.append(("pause",))
        return PauseState(paused=True, policy_version=self.train_steps, train_steps=self.train_steps)

    async def resume(self, *, admin_token: str | None = None) -> PauseState:
        self.paused = False
        self.log.append(("resume",))
        return PauseState(paused=False, policy_version=self.train_steps, train_steps=self.train_steps)

    def episode(self, task_id: str, task_type: str = "default", group_id: str | None = None, eval: bool = False,
                metadata: dict[str, Any] | None = None) -> FakeEpisode:
        return FakeEpisode(self, task_id, eval)

    # workflows
    async def train(self, task: dict[str, Any], ep: FakeEpisode) -> float:
        self.running += 1
        for _ in range(self.turns):
            await asyncio.sleep(0)
        self.running -= 1
        return 1.0

    async def evaluate(self, task: dict[str, Any], ep: FakeEpisode) -> float:
        self.log.append(("eval", self.running, self.paused, self.train_steps))
        return 0.5


def drive(server: FakeServer, clock: FakeClock, *, eval_s: float = 0.0, stopping: Any = None, **run: Any):
    """A driver run on the fake server: groups of 2, 4 in flight, a poll a second, no budget unless ``run`` (the
    pause points and the budget, as RunSettings' fields) says so."""
    async def evaluate_and_take_time():
        summary = await held_out(server, server.evaluate, EVAL_TASKS, 4)()  # type: ignore[arg-type]
        clock.advance(eval_s)
        return summary

    async def main():
        settings = RunSettings(group_size=2, concurrency=4, poll_s=1.0, **{"time_budget_s": None, **run})
        driver = Driver(server, server.train, settings, evaluate=evaluate_and_take_time, clock=clock)  # type: ignore[arg-type]
        server.stopped = lambda: driver.stopped
        return await driver.run(itertools.cycle(TASKS), stopping)

    return asyncio.run(main())


def test_pauses_at_training_clock_times_and_the_clock_excludes_them() -> None:
    server, clock = FakeServer(), FakeClock()
    run = drive(server, clock, eval_every_s=5, time_budget_s=12, eval_s=100)
    assert run.stop_reason == Stop.TIME_BUDGET
    train_s = [e.train_seconds for e in run.evals]
    # the base point, 5 and 10 s of training (15 lies past the budget), the end; each eval took 100 s
    assert len(train_s) == 4 and train_s[0] == 0.0
    assert train_s == [0.0, 5.0, 10.0, 12.0] and run.train_seconds == 12.0  # the evals' 100 s each are not counted
    assert [e.seconds for e in run.evals] == [0.0, 5.0, 110.0, 212.0] and run.seconds == 212.0
    assert all(e.eval_seconds == 100.0 for e in run.evals)
    assert [e.reward for e in run.evals] == [0.5] * 4 and all(e.episodes == 2 for e in run.evals)


def test_pauses_at_step_counts_and_max_steps_stops() -> None:
    run = drive(FakeServer(), FakeClock(), eval_every_steps=3, max_steps=10)
    assert run.stop_reason == Stop.STEPS
    assert [e.train_steps for e in run.evals] == [0, 3, 6, 9, 10]  # every 3 steps below the budget, then the end
    assert [e.policy_version for e in run.evals] == [0, 3, 6, 9, 10]
    assert [p.train_steps for p in run.steps] == list(range(2, 11))  # a step is a change from the first poll on
    assert all(p.metrics["reward_mean"] == 1.0 and p.metrics["loss"] != p.metrics["loss"] for p in run.steps)  # null: NaN

    # polls at 0, 1, 2 ... s of training see steps 1, 2, 3 ...; a step point and a time point on one poll pause once
    run = drive(FakeServer(), FakeClock(), eval_at_steps=(2, 5, 8), eval_at_s=(6.5, 7.0), max_steps=11)
    assert [e.train_steps for e in run.evals] == [0, 2, 5, 8, 11]
    assert [e.train_seconds for e in run.evals] == [0.0, 1.0, 4.0, 7.0, 10.0]


def test_in_flight_training_finishes_and_training_is_paused_before_each_eval() -> None:
    server = FakeServer(turns=3)
    run = drive(server, FakeClock(), eval_every_steps=2, max_steps=6)
    evals = [e for e in server.log if e[0] == "eval"]
    assert len(evals) == 2 * len(run.evals) == 2 * 4
    assert all(running == 0 and paused for _, running, paused, _ in evals)
    # each eval's episodes run between one pause and one resume, and training steps never move in between
    control = [e[0] for e in server.log if e[0] in ("pause", "resume", "eval")]
    assert control == ["pause", "eval", "eval", "resume"] * 4
    assert not server.paused


def test_a_refused_pause_is_logged_and_the_run_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    server = FakeServer(refuse_pause=True)
    with caplog.at_level(logging.WARNING, logger="agentjet.client.driver"):
        run = drive(server, FakeClock(), eval_every_steps=2, max_steps=4)
    assert run.stop_reason == Stop.STEPS and len(run.evals) == 3
    assert sum("could not pause training" in r.message for r in caplog.records) == 3
    assert not any(e[0] == "resume" for e in server.log)  # nothing to resume


def test_no_episode_begins_and_no_task_is_drawn_after_stop() -> None:
    server, drawn_after_stop = FakeServer(), []

    def tasks():
        for t in itertools.cycle(TASKS):
            drawn_after_stop.append(server.stopped())
            yield t

    async def main():
        driver = Driver(server, server.train, RunSettings(group_size=2, concurrency=4, max_steps=3, time_budget_s=None),  # type: ignore[arg-type]
                        evaluate=held_out(server, server.evaluate, EVAL_TASKS, 4), clock=FakeClock())  # type: ignore[arg-type]
        server.stopped = lambda: driver.stopped
        return await driver.run(tasks())

    run = asyncio.run(main())
    begins = [e for e in server.log if e[0] == "begin"]
    assert run.stop_reason == Stop.STEPS and run.train.episodes > 0
    assert not any(stopped for _, is_eval, stopped in begins if not is_eval)
    assert [stopped for _, is_eval, stopped in begins if is_eval] == [False, False, True, True]  # base, end
    assert drawn_after_stop and not any(drawn_after_stop)


def test_a_stopping_rule_sees_each_eval_and_ends_the_run() -> None:
    class Plateau:
        def __init__(self) -> None:
            self.seen: list[float] = []

        def observe_eval(self, value: float) -> None:
            self.seen.append(value)

        def check(self) -> str | None:
            return "eval_plateau" if len(self.seen) >= 3 else None

    rule = Plateau()
    run = drive(FakeServer(), FakeClock(), eval_every_steps=1, max_steps=50, stopping=rule)
    assert run.stop_reason == "eval_plateau"
    assert [e.train_steps for e in run.evals] == [0, 1, 2, 2] and rule.seen == [0.5] * 4


def test_at_pause_runs_at_each_pause_during_training_only_and_the_tasks_can_end_the_run() -> None:
    seen: list[tuple[float, bool]] = []
    server = FakeServer()

    async def at_pause(train_s: float) -> None:
        seen.append((train_s, server.paused))

    async def main():
        driver = Driver(server, server.train, RunSettings(group_size=1, concurrency=1, poll_s=1.0,  # type: ignore[arg-type]
                                                          eval_at_s=(2.0, 4.0), time_budget_s=None),
                        clock=FakeClock(), at_pause=at_pause)
        return await driver.run(TASKS * 10)

    run = asyncio.run(main())
    assert run.stop_reason == Stop.TASKS and run.train.episodes == 40 and not run.evals
    assert [round(s) for s, _ in seen] == [2, 4] and all(paused for _, paused in seen)


def test_a_driver_runs_once() -> None:
    server = FakeServer()

    async def main():
        driver = Driver(server, server.train, RunSettings(max_steps=1), clock=FakeClock())  # type: ignore[arg-type]
        await driver.run(TASKS[:1])
        await driver.run(TASKS[:1])

    with pytest.raises(RuntimeError, match="runs once"):
        asyncio.run(main())


def test_step_pauses_against_a_real_server(make_server) -> None:
    """The null engine answers '7'; a step per group of 2. Each eval runs with the trainer paused, at the step
    its point names, and the server's eval reward for that version is the point's reward."""
    srv = make_server(reply="7", admin_token="adm1n",  # every group is uniform: train on them anyway
                      training={"group_size": 2, "batch_groups": 1, "drop_uniform_groups": False})
    paused_during_eval: list[bool] = []

    async def answer(task, ep) -> float:  # noqa: ANN001
        reply = await ep.openai().chat.completions.create(model="m", messages=task["messages"], max_tokens=4)
        return addition.reward(task, reply.choices[0].message.content or "")

    async def evaluate(task, ep) -> float:  # noqa: ANN001
        paused_during_eval.append(srv.server.train_loop.paused)
        return await answer(task, ep)

    pool = [addition.make_task(a, b) for a, b in [(3, 4), (5, 2), (1, 1)]]
    evals = [addition.make_task(0, 7, "eval"), addition.make_task(1, 2, "eval")]

    async def main():
        async with SwarmClient(srv.url, token="adm1n") as client:
            driver = Driver(client, answer, RunSettings(group_size=2, concurrency=4, poll_s=0.05, eval_every_steps=2,
                                                        max_steps=5, time_budget_s=None),
                            evaluate=held_out(client, evaluate, evals, 2))
            run = await driver.run(itertools.cycle(pool))
            return run, await client.status()

    run, status = asyncio.run(main())
    assert run.stop_reason == Stop.STEPS and all(paused_during_eval) and len(paused_during_eval) == 2 * len(run.evals)
    steps = [e.train_steps for e in run.evals]
    assert steps[0] == 0 and steps[-1] >= 5 and len(steps) >= 3 and steps == sorted(steps)
    assert all(e.reward == 0.5 for e in run.evals)  # 0+7 right, 1+2 not
    assert {int(v): r for v, r in status.eval_reward.items()} == {e.policy_version: 0.5 for e in run.evals}
    assert not srv.server.train_loop.paused


def test_on_quiet_reports_a_server_that_takes_no_step() -> None:
    class Stuck(FakeServer):
        async def status(self) -> _Status:
            return _Status(0, 0)

    server, quiet = Stuck(), []

    async def main():
        driver = Driver(server, server.train, RunSettings(group_size=1, concurrency=2, poll_s=1.0, quiet_s=60,  # type: ignore[arg-type]
                                                          time_budget_s=150),
                        clock=FakeClock(), on_quiet=lambda st: quiet.append(st.train_steps))
        return await driver.run(itertools.cycle(TASKS))

    run = asyncio.run(main())
    assert run.stop_reason == Stop.TIME_BUDGET and not run.steps
    assert quiet == [0, 0]  # after 61 s and 122 s without a step


def test_a_periodic_pause_first_seen_after_the_budget_is_left_to_the_final_eval() -> None:
    """A slow poll (a loaded machine) that first sees the 2 s point when the 3 s budget is already spent runs no
    periodic eval: the run's final eval comes right after it. A point seen in time still pauses."""
    from agentjet.client.driver import _Schedule
    from agentjet.client.settings import Budget, PauseEvery

    late = _Schedule(PauseEvery(seconds=1.0), Budget(train_seconds=3.0))
    assert late.due(1.2, 0) and not late.due(3.05, 0)
    by_steps = _Schedule(PauseEvery(steps=2), Budget(max_steps=5))
    assert by_steps.due(2, 2) and not by_steps.due(4.0, 5)  # the 4-step point first seen at step 5


def test_a_run_with_begins_held_for_capacity_ends_when_it_stops(make_server) -> None:
    """More episodes in flight than the trainer admits (batch 1 group, staleness 0, 16 in flight): at the stop
    some begins are held by the server until a train step frees capacity. The run ends once they have run;
    pausing training at the stop left them held for the client's whole defer timeout (found by the objectives
    benchmark's quick run)."""
    srv = make_server(reply="7", admin_token="adm1n", training={
        "group_size": 2, "batch_groups": 1, "drop_uniform_groups": False, "max_staleness": 0})

    async def answer(task, ep) -> float:  # noqa: ANN001
        reply = await ep.openai().chat.completions.create(model="m", messages=task["messages"], max_tokens=4)
        return addition.reward(task, reply.choices[0].message.content or "")

    pool = [addition.make_task(a, b) for a, b in [(3, 4), (5, 2), (1, 1)]]

    async def main():
        async with SwarmClient(srv.url, token="adm1n", defer_timeout=600) as client:
            driver = Driver(client, answer, RunSettings(group_size=2, concurrency=16, poll_s=0.05, max_steps=3,
                                                        time_budget_s=None),
                            evaluate=held_out(client, answer, pool[:1], 1))
            return await asyncio.wait_for(driver.run(itertools.cycle(pool)), 60)

    run = asyncio.run(main())
    assert run.stop_reason == Stop.STEPS and run.train.failed == 0 and run.evals[-1].train_steps >= 3
    assert srv.server.admission.counters.held > 0  # begins were held at the stop or before it
    assert not srv.server.train_loop.paused


class _WaitingEpisode:
    """An episode whose begin never gets an answer (a begin held by the server, or deferred again and again)."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def begin(self) -> _WaitingEpisode:
        self.log.append("waiting")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.log.append("given up")
            raise
        raise AssertionError("unreachable")


def test_the_stop_gives_up_begins_still_waiting_on_the_server() -> None:
    """A cocktail run whose type was deferred waited out the client's defer timeout (an hour) after its budget
    ended (found by the reasoning-gym cocktail). The stop now gives up every begin not yet answered."""
    log: list[str] = []

    class Client:
        def group_size(self, requested: int | None = None) -> int:
            return 2

        def episode(self, **_: Any) -> _WaitingEpisode:
            return _WaitingEpisode(log)

    async def never(task: dict[str, Any], ep: Any) -> float:
        raise AssertionError("no episode begins")

    async def main():
        stop = asyncio.Event()
        run = asyncio.create_task(run_workflow(Client(), never, itertools.cycle(TASKS), concurrency=4,  # type: ignore[arg-type]
                                               stop=stop))
        while log.count("waiting") < 4:
            await asyncio.sleep(0)
        stop.set()
        return await asyncio.wait_for(run, 5)

    summary = asyncio.run(main())
    assert log.count("given up") == 4 and summary.not_begun == 4
    assert summary.failed == 0 and summary.episodes == 0  # not failures: these episodes never existed


def test_a_begin_deferred_by_a_cocktail_quota_is_given_up_at_the_stop(make_server) -> None:
    """Against a real server: math is two batches ahead of its share, so its begin is deferred (429
    ``deferred``) and the client waits it out (defer timeout 600 s) until the stop."""
    srv = make_server(training={"group_size": 2, "batch_groups": 2, "task_ratios": {"math": 0.5, "code": 0.5}})

    async def main() -> tuple[bool, list[int]]:
        async with SwarmClient(srv.url, defer_timeout=600, admission_wait_s=0) as client:
            await client.episode(task_id="code-1", task_type="code").begin()  # code is present
            for _ in range(4):
                await client.episode(task_id="math-1", task_type="math").begin()
            answers: list[int] = []

            async def record(resp: httpx.Response) -> None:
                answers.append(resp.status_code)

            client._http.event_hooks["response"].append(record)
            stop = asyncio.Event()
            deferred = asyncio.create_task(begin_unless_stopped(client.episode(task_id="math-2", task_type="math"),
                                                                stop))
            while len(answers) < 2:  # deferred twice, 500 ms apart, and waiting for its next try
                await asyncio.sleep(0.05)
            stop.set()
            return await asyncio.wait_for(deferred, 5), answers

    begun, answers = asyncio.run(main())
    assert not begun and answers and set(answers) == {429}
    assert srv.server.status().buffer.open_episodes == 5  # the four math and one code: the deferred one never began
