"""Invariant 4: one client's bad request never fails another client's call, even when they share an engine
batch. Only the culprit gets an error, and it names the real field."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from agentjet.engines.base import GenerationError, SamplingParams
from agentjet.layouts import embedded_engine
from agentjet.layouts.composed import ComposedEngine
from agentjet.runtime.blocking import run_blocking

USER = [{"role": "user", "content": "what is 1 + 2?"}]
HOSTILE = [
    ({"seed": 2**64}, "seed"), ({"seed": -5}, "seed"), ({"top_k": 1e30}, "top_k"), ({"top_k": 10**7}, "top_k"),
    ({"temperature": float("nan")}, "temperature"), ({"temperature": 1e9}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 2**40}, "max_tokens"),
    ({"n": 10**6}, "n"), ({"top_logprobs": 99, "logprobs": True}, "top_logprobs"),
    ({"stop": ["", "x"]}, "stop"), ({"seed": "zero"}, "seed"), ({"top_k": True, "seed": 2**63}, "seed"),
]


def test_engine_fails_only_the_request_it_cannot_prepare(tiny_engine: ComposedEngine, chat_ids) -> None:
    ids = chat_ids("hello", tiny_engine)

    async def main() -> list:
        good = [tiny_engine.generate(ids, SamplingParams(max_tokens=6, seed=i)) for i in range(6)]
        bad = tiny_engine.generate(ids, SamplingParams(max_tokens=6, stop_token_ids=(10**9,)))
        return await asyncio.gather(*good, bad, return_exceptions=True)

    *good, bad = asyncio.run(main())
    assert all(len(r.token_ids) == 6 for r in good)
    assert isinstance(bad, GenerationError) and bad.param == "stop_token_ids"
    assert tiny_engine.generator.stats["batches"] >= 1


def _poison(engine: ComposedEngine, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """Make every batch (static), prefill or decode step (continuous) that holds a row with seed 13 fail."""
    def poisoned(real):
        def run(rows, *args):
            if any(r.params.seed == 13 for r in rows):
                raise RuntimeError("Overflow when unpacking long long")
            return real(rows, *args)
        return run

    target = engine.generator.generator if where == "static" else engine.generator.core.scheduler
    name = {"static": "generate_batch", "prefill": "_prefill_logits", "decode": "_decode_logits"}[where]
    monkeypatch.setattr(target, name, poisoned(getattr(target, name)))


@pytest.mark.parametrize("where", ["static", "prefill", "decode"])
def test_a_batch_that_fails_is_rerun_request_by_request(tiny_model_path, chat_ids, monkeypatch: pytest.MonkeyPatch,
                                                        where: str) -> None:
    """A failure inside the batch itself (not caught while preparing) still fails only its culprit: a static
    batch, a prefill of several joiners, or a decode step of several rows."""
    from agentjet.settings import GeneratorSettings

    engine = embedded_engine(tiny_model_path, GeneratorSettings(max_batch_size=8, batch_wait_ms=50,
                                                         batching="static" if where == "static" else "continuous"))
    try:
        ids = chat_ids("hello", engine)
        _poison(engine, monkeypatch, where)

        async def main() -> list:
            reqs = [engine.generate(ids, SamplingParams(max_tokens=5, seed=s, stop_token_ids=()))
                    for s in (1, 2, 13, 4)]
            return await asyncio.gather(*reqs, return_exceptions=True)

        results = asyncio.run(main())
        assert [isinstance(r, Exception) for r in results] == [False, False, True, False], results
        assert engine.generator.stats["isolated_failures"] >= 1
        # the same seeds alone give the same tokens: the survivors were really generated, not placeholders
        for seed, res in zip((1, 2, 4), (results[0], results[1], results[3]), strict=True):
            alone = asyncio.run(engine.generate(ids, SamplingParams(max_tokens=5, seed=seed, stop_token_ids=())))
            assert res.token_ids == alone.token_ids and len(res.token_ids) == 5
    finally:
        run_blocking(engine.close())


def test_a_failed_decode_step_fails_streamed_rows_and_never_hangs(tiny_engine: ComposedEngine, chat_ids,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows that already streamed tokens cannot be re-run (their tokens were sent): they get the error; the
    others are re-run on their own and succeed."""
    ids = chat_ids("hello", tiny_engine)
    real = tiny_engine.generator.core.scheduler._decode_logits
    calls = {"n": 0}

    def flaky(rows):  # the third decode step fails, once
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("device hiccup")
        return real(rows)

    monkeypatch.setattr(tiny_engine.generator.core.scheduler, "_decode_logits", flaky)
    streamed: list[int] = []

    async def main() -> list:
        quiet = [tiny_engine.generate(ids, SamplingParams(max_tokens=6, seed=s, stop_token_ids=())) for s in (1, 2)]
        loud = tiny_engine.generate(ids, SamplingParams(max_tokens=6, seed=3, stop_token_ids=()),
                                    on_token=lambda t, _lp: streamed.append(t))
        return await asyncio.wait_for(asyncio.gather(*quiet, loud, return_exceptions=True), 60)

    a, b, loud = asyncio.run(main())
    assert isinstance(loud, RuntimeError) and streamed  # it had streamed tokens: it fails
    assert len(a.token_ids) == 6 and len(b.token_ids) == 6
    alone = asyncio.run(tiny_engine.generate(ids, SamplingParams(max_tokens=6, seed=1, stop_token_ids=())))
    assert a.token_ids == alone.token_ids


def test_hostile_parameters_never_fail_a_concurrent_normal_client(make_server) -> None:
    srv = make_server("tiny", training={"group_size": 64})
    keys = [httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": c, "task_id": "t"}).json()["api_key"]
            for c in ("good", "evil")]

    async def main() -> tuple[list[httpx.Response], list[httpx.Response]]:
        async with httpx.AsyncClient(timeout=120) as http:
            def call(key: str, extra: dict) -> object:
                body = json.dumps({"model": "tiny", "messages": USER, "max_tokens": 8, **extra})  # NaN allowed
                return http.post(f"{srv.url}/v1/chat/completions", content=body,
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})

            rounds = []
            for _ in range(3):  # normal and hostile calls land in the same engine batches
                good = [call(keys[0], {"seed": i}) for i in range(4)]
                evil = [call(keys[1], extra) for extra, _ in HOSTILE]
                rounds.append(await asyncio.gather(*good, *evil))
        goods = [r for rs in rounds for r in rs[:4]]
        evils = [r for rs in rounds for r in rs[4:]]
        return goods, evils

    goods, evils = asyncio.run(main())
    assert all(r.status_code == 200 for r in goods), [r.text for r in goods if r.status_code != 200]
    for r, (extra, field) in zip(evils, HOSTILE * 3, strict=True):
        assert 400 <= r.status_code < 500, (extra, r.status_code, r.text)
        assert field in (r.json()["error"]["param"] or ""), (extra, r.json())
