"""``POST /v1/completions`` (legacy) against a live server on the tiny model through ``openai.completions``: no
chat template (the prompt's ids as given), the same generation and recording path, ``echo`` with ``logprobs``
scored by the learner, streaming, ``n``, and what it refuses."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx
import openai
import pytest

from agentjet import SwarmClient


def test_completions_record_the_prompt_ids_as_given_and_stream_the_same_text(make_server) -> None:
    srv = make_server("tiny")
    tok = srv.server.engine.tokenizer
    ids = tok.encode("The capital of France is")

    async def main() -> tuple[Any, ...]:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            oa = openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0)
            text = await oa.completions.create(model="tiny", prompt="The capital of France is", max_tokens=8, seed=4)
            given = await oa.completions.create(model="tiny", prompt=ids, max_tokens=8, seed=4)
            stream = await oa.completions.create(model="tiny", prompt=ids, max_tokens=8, seed=4, stream=True,
                                                 stream_options={"include_usage": True})
            chunks = [c async for c in stream]
            two = await oa.completions.create(model="tiny", prompt=ids, max_tokens=3, n=2, seed=1)
            calls = list(srv.server.registry.get(ep.episode_id).calls)
            ep.reward(0.0)
        return text, given, chunks, two, calls

    text, given, chunks, two, calls = asyncio.run(main())
    assert text.object == "text_completion" and text.choices[0].text == given.choices[0].text
    assert text.usage.prompt_tokens == len(ids) and text.usage.completion_tokens == 8
    assert text.choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text.choices[0].text
    assert chunks[-1].usage.completion_tokens == 8 and not chunks[-1].choices
    assert len(two.choices) == 2
    assert [c.api for c in calls] == ["completions"] * 5
    assert all(c.prompt_ids == ids and c.messages == [] for c in calls)  # no chat template: the ids as given
    assert tok.decode(calls[0].completion_ids, skip_special_tokens=True) == text.choices[0].text


def test_echo_with_logprobs_scores_the_prompt_as_the_model_generated_it(make_server) -> None:
    """The logprobs of a reply at temperature 1 are what the learner's teacher-forced scoring gives the same
    tokens as a prompt (echo, max_tokens 0: scoring only, nothing recorded)."""
    srv = make_server("tiny")
    tok = srv.server.engine.tokenizer
    ids = tok.encode("one two three")

    async def main() -> tuple[Any, ...]:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            oa = openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0)
            made = await oa.completions.create(model="tiny", prompt=ids, max_tokens=6, seed=2, temperature=1,
                                               logprobs=2, echo=True)
            generated = srv.server.registry.get(ep.episode_id).calls[0].completion_ids
            scored = await oa.completions.create(model="tiny", prompt=ids + generated, max_tokens=0, echo=True,
                                                 logprobs=0)
            recorded = len(srv.server.registry.get(ep.episode_id).calls)
            ep.reward(0.0)
        return made, generated, scored, recorded

    made, generated, scored, recorded = asyncio.run(main())
    lp = made.choices[0].logprobs
    assert made.choices[0].text.startswith("one two three")
    assert len(lp.tokens) == len(ids) + len(generated) == len(lp.token_logprobs) == len(lp.text_offset)
    assert lp.token_logprobs[0] is None and all(x < 0 for x in lp.token_logprobs[1:])
    assert all(len(top) == 2 for top in lp.top_logprobs[len(ids):])
    again = scored.choices[0].logprobs.token_logprobs
    assert len(again) == len(ids) + len(generated) and recorded == 1
    assert again[1:len(ids)] == pytest.approx(lp.token_logprobs[1:len(ids)], abs=1e-5)
    for behaviour, teacher in zip(lp.token_logprobs[len(ids):], again[len(ids):], strict=True):
        assert math.isclose(behaviour, teacher, abs_tol=1e-3), (behaviour, teacher)


@pytest.mark.parametrize(("extra", "param"), [
    ({"suffix": "end"}, "suffix"), ({"best_of": 3}, "best_of"), ({"presence_penalty": 1.0}, "presence_penalty"),
    ({"logit_bias": {"5": 1}}, "logit_bias"), ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": [1.5]}, "prompt"),
    ({"prompt": ""}, "prompt"), ({"prompt": [10**9]}, "prompt"), ({"max_tokens": 0}, "max_tokens"),
    ({"n": 2, "stream": True}, "n"), ({"max_tokens": 10**6}, "max_tokens"),
])
def test_what_completions_cannot_honour_is_refused_by_name(make_server, extra: dict[str, Any], param: str) -> None:
    srv = make_server()
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        ep = http.post("/swarm/v1/episodes", json={"client_id": "c", "task_id": "t"}).json()
        r = http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", **extra},
                      headers={"Authorization": f"Bearer {ep['api_key']}"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert srv.server.registry.get(ep["episode_id"]).calls == []
