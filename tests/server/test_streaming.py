"""Streaming through the server with the continuous engine: the streamed text equals the non-streamed reply,
stop strings included, and pieces arrive token by token."""

from __future__ import annotations

import asyncio

from agentjet.client import SwarmClient

USER = [{"role": "user", "content": "write a word"}]


def test_streamed_text_with_stop_strings_equals_the_reply(make_server) -> None:
    srv = make_server("tiny")

    async def main() -> list[tuple[str, str, int]]:
        out = []
        async with SwarmClient(srv.url) as client, client.episode(task_id="t") as ep:
            oa = ep.openai()
            full = await oa.chat.completions.create(model="tiny", messages=USER, max_tokens=40, seed=11)
            text = full.choices[0].message.content
            assert len(text) > 12
            for stop in (None, [text[8:11]], [text[8:11], "zzzz-not-there"], [text[2:3]]):
                kw = {"stop": stop} if stop else {}
                plain = await oa.chat.completions.create(model="tiny", messages=USER, max_tokens=40, seed=11, **kw)
                stream = await oa.chat.completions.create(model="tiny", messages=USER, max_tokens=40, seed=11,
                                                          stream=True, **kw)
                pieces = [c.choices[0].delta.content async for c in stream
                          if c.choices and c.choices[0].delta.content]
                out.append((plain.choices[0].message.content, "".join(pieces), len(pieces)))
            ep.reward(0.0)
        return out

    rows = asyncio.run(main())
    for plain, streamed, _ in rows:
        assert streamed == plain
    assert rows[0][2] > 1  # the unconstrained reply came in several pieces
    assert all(len(plain) < len(rows[0][0]) for plain, _, _ in rows[1:])  # each stop string cut the reply
