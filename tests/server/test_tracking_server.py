"""Context tracking through the real server: a multi-turn agent's calls merge into one sample, the
trace endpoint shows tokens, masks and call boundaries, and its access is scoped."""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

import httpx

from agentjet import SwarmClient


async def multi_turn(client: SwarmClient, turns: int) -> tuple[str, str]:
    async with client.episode(task_id="chat") as ep:
        oa = ep.openai()
        messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello"}]
        for i in range(turns):
            reply = await oa.chat.completions.create(model="x", messages=messages, max_tokens=6, seed=i)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": f"and then {i}?"}]
        ep.reward(1.0)
    return ep.episode_id, ep.api_key


def test_multi_turn_calls_merge_and_trace(make_server) -> None:
    srv = make_server("tiny", admin_token="adm1n")

    async def main():
        async with SwarmClient(srv.url) as client:
            return await multi_turn(client, 4)

    eid, key = asyncio.run(main())
    trace = httpx.get(f"{srv.url}/swarm/v1/episodes/{eid}/trace", headers={"Authorization": "Bearer adm1n"}).json()
    assert trace["calls"] == 4
    assert trace["report"]["merged_calls"] == 3 and len(trace["samples"]) == 1  # one sequence for 4 calls
    sample = trace["samples"][0]
    assert sample["call_indices"] == [0, 1, 2, 3]
    assert len(sample["pieces"]) == len(sample["token_ids"]) == len(sample["loss_mask"]) == sample["num_tokens"]
    assert len(sample["calls"]) == 4
    # every trained token belongs to a call's generated span and has a real logprob
    for t, m in enumerate(sample["loss_mask"]):
        if m:
            assert sample["token_call"][t] is not None and sample["logprobs"][t] < 0
    # the episode's own key may read its trace; another key or none may not
    assert httpx.get(f"{srv.url}/swarm/v1/episodes/{eid}/trace",
                     headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert httpx.get(f"{srv.url}/swarm/v1/episodes/{eid}/trace").status_code == 401
    assert httpx.get(f"{srv.url}/swarm/v1/episodes/ep-nope/trace",
                     headers={"Authorization": "Bearer adm1n"}).status_code == 404


def test_merging_off_keeps_one_sample_per_call(make_server) -> None:
    from agentjet.settings import TrackingSettings

    srv = make_server("tiny", tracking=TrackingSettings(merge=False))

    async def main():
        async with SwarmClient(srv.url) as client:
            return await multi_turn(client, 3)

    eid, _ = asyncio.run(main())
    samples = srv.server.store.samples_for([eid])[eid]
    assert len(samples) == 3
    # per-episode weighting: the episode's trained tokens share a total weight of 1
    total = sum(s.weight * sum(s.loss_mask) for s in samples)
    assert abs(total - 1.0) < 1e-9


def test_tool_using_agent_merges_on_a_template_without_tool_support(make_server) -> None:
    """The recorded messages are what the template rendered (tools folded into the system prompt), so the
    tracker re-renders the recorded prompts exactly and a tool loop merges into one sample."""
    reply = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    srv = make_server(reply=reply)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]

    async def main():
        async with SwarmClient(srv.url) as client, client.episode(task_id="tools") as ep:
            oa = ep.openai()
            messages = [{"role": "user", "content": "add 1 and 2"}]
            for i in range(3):
                r = await oa.chat.completions.create(model="x", messages=messages, tools=tools)
                msg = r.choices[0].message
                assert msg.tool_calls
                messages += [msg.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": str(3 + i)}]
            ep.reward(1.0)
            return ep.episode_id

    eid = asyncio.run(main())
    report = srv.server.store.tracking_report(eid)
    assert report["retokenize_failures"] == 0
    assert report["samples"] == 1 and report["merged_calls"] == 2


def spelled_reply(tokenizer, word: str = "hello there") -> list[int]:
    """A non-canonical tokenization: the first word spelled one character per token."""
    first, rest = word.split(" ", 1)
    spelled = [t for ch in first for t in tokenizer.encode(ch, add_special_tokens=False)]
    ids = spelled + tokenizer.encode(" " + rest, add_special_tokens=False)
    assert ids != tokenizer.encode(word, add_special_tokens=False), "the test needs a word that BPE merges"
    assert tokenizer.decode(ids) == word
    return ids


class DriftRun(NamedTuple):
    srv: Any
    tok: Any
    ids: list[int]  # what the engine generated (before its EOS)
    first: list[int]  # the prompts the engine received
    second: list[int]
    episode_id: str


def drifted_two_turns(make_server, tiny_model_path, **config) -> DriftRun:
    """Two turns of one agent against a null engine that generates a non-canonical tokenization; the second turn
    resends the first reply as text."""
    from transformers import AutoTokenizer

    from agentjet.layouts.null import null_engine

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    ids = spelled_reply(tok)
    engine = null_engine(tok, reply_ids=ids)
    srv = make_server(engine, **config)

    async def main():
        async with SwarmClient(srv.url) as client, client.episode(task_id="tito") as ep:
            oa = ep.openai()
            messages = [{"role": "user", "content": "greet me"}]
            r = await oa.chat.completions.create(model="x", messages=messages)
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": "again"}]
            await oa.chat.completions.create(model="x", messages=messages)
            ep.reward(1.0)
            return ep.episode_id

    eid = asyncio.run(main())
    first, second = list(engine.generator.prompts)[-2:]
    return DriftRun(srv, tok, ids, first, second, eid)


def test_tito_feeds_the_model_its_own_tokens_at_request_time(make_server, tiny_model_path) -> None:
    """The model generated a non-canonical tokenization; when the agent resends that reply as text, the
    server's prompt holds the generated ids (not the re-tokenization), so the tracker finds no drift."""
    run = drifted_two_turns(make_server, tiny_model_path)
    first, second = run.first, run.second
    generated = run.ids + [run.tok.eos_token_id]
    assert second[:len(first)] == first
    window = second[len(first):len(first) + len(generated)]
    assert window == generated  # the model sees exactly what it produced
    status = httpx.get(f"{run.srv.url}/swarm/v1/status").json()
    assert status["throughput"]["tito_prompts_spliced"] == 1
    assert status["throughput"]["tito_drift_prevented"] == 1
    assert status["throughput"]["tito_fallbacks"] == 0
    report = run.srv.server.store.tracking_report(run.episode_id)
    assert report["drift_mismatches"] == 0 and report["retokenize_failures"] == 0
    assert report["samples"] == 1 and report["merged_calls"] == 1
    ep = run.srv.server.registry.get(run.episode_id)
    assert ep is not None and ep.tito is None  # the episode's TITO session (prompt-sized) goes when it ends


def test_tito_off_leaves_drift_to_the_episode_end_repair(make_server, tiny_model_path) -> None:
    from agentjet.settings import TrackingSettings

    run = drifted_two_turns(make_server, tiny_model_path, tracking=TrackingSettings(tito=False))
    first, second = run.first, run.second
    assert second[len(first):len(first) + len(run.ids)] != run.ids  # the re-tokenization, not what was generated
    status = httpx.get(f"{run.srv.url}/swarm/v1/status").json()
    assert status["throughput"]["tito_prompts_spliced"] == 0
    report = run.srv.server.store.tracking_report(run.episode_id)
    assert report["drift_mismatches"] == 1 and report["drift_repaired"] == 1
    assert report["samples"] == 1  # repaired at episode end, so the calls still merge
