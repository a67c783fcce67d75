"""Every API is recorded like chat: the trace holds the engine's own token ids (no re-tokenization of text) and
per-token policy versions, a harness that resends its whole history merges into one sample, and the trace names
the API of each call. The engine here generates a non-canonical tokenization (a word spelled one character per
token) that re-encoding the text would change, and moves the policy version inside each reply."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import openai
import pytest
from tests.server.harness_helpers import Recording, generated_spans, trace
from tests.server.test_tracking_server import spelled_reply
from transformers import AutoTokenizer

from agentjet import SwarmClient
from agentjet.layouts.null import null_engine


async def two_turns(api: str, ep: Any) -> None:
    """Two turns of a harness that resends its whole history, the first reply as text."""
    if api == "chat.completions":
        oa = openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "greet me"}]
        first = await oa.chat.completions.create(model="tiny", messages=messages)
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "again"}]
        await oa.chat.completions.create(model="tiny", messages=messages)
    elif api == "responses":
        oa = openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0)
        items: list[dict[str, Any]] = [{"role": "user", "content": "greet me"}]
        made = await oa.responses.create(model="tiny", input=items, store=False)
        items += [o.model_dump(exclude_none=True) for o in made.output]
        items.append({"role": "user", "content": "again"})
        await oa.responses.create(model="tiny", input=items, store=False)
    else:
        an = anthropic.AsyncAnthropic(base_url=ep.anthropic_base_url, api_key=ep.api_key, max_retries=0)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "greet me"}]
        made = await an.messages.create(model="tiny", messages=msgs, max_tokens=50)
        msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in made.content]},
                 {"role": "user", "content": "again"}]
        await an.messages.create(model="tiny", messages=msgs, max_tokens=50)


@pytest.mark.parametrize("api", ["chat.completions", "responses", "messages"])
def test_the_trace_holds_the_engines_own_ids_and_versions_merged_across_calls(make_server, tiny_model_path,
                                                                                api: str) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    ids = spelled_reply(tok)
    engine = null_engine(tok, reply_ids=ids, update_at_token=3)  # each reply spans a policy update
    recorded = Recording(engine)
    srv = make_server(engine, admin_token="adm1n")

    async def main() -> tuple[str, Any]:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            await two_turns(api, ep)
            ep.reward(1.0)
        return ep.episode_id, ep.result

    eid, ended = asyncio.run(main())
    assert ended.acknowledged and ended.calls == 2 and ended.samples == 1  # one reward ended the episode
    tr = trace(srv, eid)
    (sample,) = tr["samples"]
    assert sample["call_indices"] == [0, 1] and [c["api"] for c in sample["calls"]] == [api, api]
    engine_ids = [r.token_ids for r in recorded.results]
    assert [span for _, span in generated_spans(tr)] == engine_ids  # token for token what the engine generated
    canonical = tok.encode(tok.decode(ids), add_special_tokens=False) + [tok.eos_token_id]
    assert engine_ids[0] != canonical  # so a re-tokenization of the text would have shown
    for call, result in zip(sample["calls"], recorded.results, strict=True):
        a, b = call["generated"]
        assert sample["versions"][a:b] == result.versions and len(set(result.versions)) == 2
        assert sample["logprobs"][a:b] == pytest.approx(result.logprobs)
    assert len(sample["version_changes"]) == 2  # one update inside each reply
