"""The Tinker domain on the fake clock: leases, futures' long poll, seq_id order (no HTTP, no model)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentjet.runtime.clock import FakeClock
from agentjet.server.tinker import TinkerError, TinkerService
from agentjet.server.tinker.models import TinkerModel

pytestmark = pytest.mark.server


class FakeAdapters:
    def __init__(self) -> None:
        self.live: list[str] = []

    def names(self) -> list[str]:
        return list(self.live)

    async def add(self, name: str, rank: int | None = None, unembed: bool = False) -> None:
        self.live.append(name)

    async def remove(self, name: str) -> None:
        self.live.remove(name)


def service(tmp_path: Path, clock: FakeClock, adapters=None) -> TinkerService:
    return TinkerService(key="tml-k", served_name="tiny", model_path="/m", adapters=adapters, base_rank=4,
                         max_context=64, clock=clock, data_dir=tmp_path, lease_seconds=60)


def test_a_session_that_stops_heartbeating_loses_its_models_and_their_adapters(tmp_path: Path) -> None:
    async def go() -> None:
        clock, adapters = FakeClock(), FakeAdapters()
        s = service(tmp_path, clock, adapters)
        a, b = s.sessions.create([]), s.sessions.create([])
        model = await s.models.create(a.session_id, "tiny", 4, {})
        assert adapters.names() == [model.adapter]
        clock.advance(50)
        s.heartbeat(b.session_id)
        clock.advance(20)  # a: 70 s without a heartbeat; b: 20 s
        s.heartbeat(b.session_id)
        await asyncio.sleep(0.01)
        assert a.session_id not in s.sessions.live and b.session_id in s.sessions.live
        assert adapters.names() == [] and model.model_id not in s.models.live
        with pytest.raises(TinkerError, match="unknown session"):
            s.heartbeat(a.session_id)

    asyncio.run(go())


def test_a_long_poll_answers_try_again_on_the_servers_clock_and_requests_run_in_seq_order(tmp_path: Path) -> None:
    async def go() -> None:
        clock = FakeClock()
        s = service(tmp_path, clock)
        gate = asyncio.Event()

        async def slow() -> dict:
            await gate.wait()
            return {"ok": 1}

        rid = s.futures.submit(None, slow)
        assert await s.futures.retrieve(rid, wait_s=20) is None  # the fake clock moved 20 s: try again
        gate.set()
        fut = await s.futures.retrieve(rid, wait_s=20)
        assert fut is not None and fut.result == {"ok": 1}

        s.models.live["m"] = TinkerModel("m", "sess", "m", 4, "tiny")
        order: list[int] = []

        def job(i: int):
            async def run() -> int:
                order.append(i)
                return i
            return run

        rids = [s.futures.submit("m", job(i), seq_id=i) for i in (3, 2, 1)]  # arrive out of order, the first sets the floor
        for r in rids:
            await s.futures.retrieve(r, wait_s=1)
        assert sorted(order) == [1, 2, 3] and order[0] == 3
        with pytest.raises(TinkerError, match="unknown request"):
            await s.futures.retrieve("nope")

    asyncio.run(go())


def test_failed_futures_carry_an_error_and_a_category(tmp_path: Path) -> None:
    async def go() -> None:
        s = service(tmp_path, FakeClock())

        async def bad_input() -> None:
            raise ValueError("bad datum")

        async def bug() -> None:
            raise RuntimeError("boom")

        f1 = await s.futures.retrieve(s.futures.submit(None, bad_input))
        f2 = await s.futures.retrieve(s.futures.submit(None, bug))
        assert f1 is not None and f1.error is not None and (f1.error.category, f1.error.message) == ("user", "bad datum")
        assert f2 is not None and f2.error is not None and f2.error.category == "server"

    asyncio.run(go())


def test_requests_waiting_for_a_seq_id_that_never_comes_fail_when_the_session_ends(tmp_path: Path) -> None:
    async def go() -> None:
        clock, adapters = FakeClock(), FakeAdapters()
        s = service(tmp_path, clock, adapters)
        a = s.sessions.create([])
        model = await s.models.create(a.session_id, "tiny", 4, {})
        first = s.futures.submit(model.model_id, lambda: asyncio.sleep(0, {"ok": 1}), seq_id=1)
        ahead = s.futures.submit(model.model_id, lambda: s.models.optim_step(model, {}), seq_id=10**6)  # a bad seq_id
        done = await s.futures.retrieve(first, wait_s=1)
        assert done is not None and done.result == {"ok": 1}
        assert await s.futures.retrieve(ahead, wait_s=5) is None and s.futures.waiting_turn(s.futures.live[ahead])
        await s.finish(a.session_id)
        fut = await s.futures.retrieve(ahead, wait_s=5)
        assert fut is not None and fut.error is not None and fut.error.category == "user"
        assert "no adapter" in fut.error.message

    asyncio.run(go())


def test_a_finished_future_nobody_retrieves_is_dropped_after_its_keep_time(tmp_path: Path) -> None:
    from agentjet.server.tinker.futures import FUTURE_KEEP_S

    async def go() -> None:
        clock = FakeClock()
        s = service(tmp_path, clock)
        session = s.sessions.create([])

        async def work() -> dict:
            return {"ok": True}

        early = s.futures.submit(None, work)
        await asyncio.sleep(0.01)  # it finishes
        clock.advance(FUTURE_KEEP_S / 2)
        late = s.futures.submit(None, work)
        await asyncio.sleep(0.01)
        clock.advance(FUTURE_KEEP_S / 2 + 1)
        s.heartbeat(session.session_id)  # the reap pass (expire) runs on every heartbeat too
        assert early not in s.futures.live and late in s.futures.live  # only the one finished longer ago than the keep time
        fut = await s.futures.retrieve(late)
        assert fut is not None and fut.result == {"ok": True}
        with pytest.raises(TinkerError, match="unknown request id"):
            await s.futures.retrieve(early)

    asyncio.run(go())


def test_a_finished_future_answers_every_retrieve_until_it_expires(tmp_path: Path) -> None:
    """A poll retried after the client's own timeout (the answer was lost on the way) gets the same answer: a result
    is not forgotten when it is first retrieved, only FUTURE_KEEP_S after it finished."""
    from agentjet.server.tinker.futures import FUTURE_KEEP_S

    async def go() -> None:
        clock = FakeClock()
        s = service(tmp_path, clock)

        async def work() -> dict:
            return {"answer": 42}

        rid = s.futures.submit(None, work)
        await asyncio.sleep(0.01)  # it finishes (a retrieve that waited would move the fake clock by its long poll)
        first = await s.futures.retrieve(rid)
        clock.advance(FUTURE_KEEP_S - 1)
        s.expire()
        again = await s.futures.retrieve(rid)
        assert first is again and again is not None and again.result == {"answer": 42}
        clock.advance(2)
        s.expire()
        with pytest.raises(TinkerError, match="unknown request id"):
            await s.futures.retrieve(rid)

    asyncio.run(go())


def test_the_sdks_error_events_reach_the_server_log_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from agentjet.server.tinker.telemetry import ClientErrors

    clock = FakeClock()
    errors = ClientErrors(clock, limit=3, window_s=60)
    event = {"event": "GENERIC_EVENT", "event_name": "APIFuture.result_async.application_error", "severity": "ERROR",
             "event_data": {"error": "boom\nline two", "request_type": "ForwardBackward"}}
    quiet = {"event": "SESSION_START", "severity": "INFO"}
    with caplog.at_level(logging.WARNING, logger="agentjet.server.tinker.telemetry"):
        assert errors.record({"session_id": "s1", "sdk_version": "0.38.0", "events": [quiet, *[event] * 5]}) == 3
        assert errors.record({"events": "not a list"}) == 0
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 3 and all("APIFuture.result_async.application_error" in x and "boom | line two" in x
                                       and "session s1" in x for x in lines)
        clock.advance(61)  # a new window: the count of what was left out, then the event
        assert errors.record({"events": [event]}) == 1
        lines = [r.getMessage() for r in caplog.records]
        assert "2 more were not logged" in lines[3] and "application_error" in lines[4]


def test_an_error_event_with_invalid_unicode_is_logged_as_valid_utf8(caplog: pytest.LogCaptureFixture) -> None:
    """A client's lone surrogate reaches the log escaped, so every handler (a file, a test capture sent between
    processes) can write the line."""
    import logging

    from agentjet.server.tinker.telemetry import ClientErrors

    errors = ClientErrors(FakeClock())
    event = {"event_name": "boom\udfff", "severity": "ERROR", "event_data": {"k\ud800": "v\udfff"}}
    with caplog.at_level(logging.WARNING, logger="agentjet.server.tinker.telemetry"):
        assert errors.record({"session_id": "s\udfff", "sdk_version": "0.38.0", "events": [event]}) == 1
    (line,) = [r.getMessage() for r in caplog.records]
    line.encode("utf-8")  # raises on a lone surrogate
    assert "boom\\udfff" in line and "session s\\udfff" in line and "k\\ud800=v\\udfff" in line
