"""An agent harness's next call reuses the keys and values of its previous one, through the APIs harnesses speak
(Anthropic's Messages for Claude Code, OpenAI's Responses for Codex), with the real, pinned SDKs: each call resends
the whole history, and the embedded engine prefills only what is new."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from agentjet import SwarmClient
from agentjet.layouts import embedded_engine
from agentjet.settings import GeneratorSettings

SYSTEM = " ".join(f"Rule {i}: answer the user in plain words, and never call a tool twice." for i in range(40))
QUESTIONS = ["what is the first rule?", "and the second one?", "say it again"]


async def anthropic_episode(ep: Any) -> None:
    an = anthropic.AsyncAnthropic(base_url=ep.anthropic_base_url, api_key=ep.api_key, max_retries=0, timeout=120)
    history: list[dict[str, Any]] = []
    for q in QUESTIONS:
        history.append({"role": "user", "content": q})
        reply = await an.messages.create(model="tiny", system=SYSTEM, messages=history, max_tokens=8)
        history.append({"role": "assistant", "content": reply.content[0].text or "ok"})


async def responses_episode(ep: Any) -> None:
    oa = openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0, timeout=120)
    history: list[dict[str, Any]] = []
    for q in QUESTIONS:
        history.append({"role": "user", "content": q})
        reply = await oa.responses.create(model="tiny", instructions=SYSTEM, input=history, max_output_tokens=8,
                                          store=False)
        history.append({"role": "assistant", "content": reply.output_text or "ok"})


@pytest.mark.parametrize("episode", [anthropic_episode, responses_episode], ids=["messages", "responses"])
def test_a_harness_episodes_calls_reuse_the_previous_calls_keys(make_server, tiny_model_path: Path, episode) -> None:
    engine = embedded_engine(tiny_model_path, GeneratorSettings(max_batch_size=4))
    srv = make_server(engine)

    async def main() -> None:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            await episode(ep)
            ep.reward(1.0)

    asyncio.run(main())
    stats = engine.generator.stats
    system_tokens = len(engine.generator.tokenizer.encode(SYSTEM, add_special_tokens=False))
    assert stats["prefix_kept"] == len(QUESTIONS)
    assert stats["prefix_hits"] == len(QUESTIONS) - 1  # every call after the first
    # each reused at least the system prompt and the turns before it
    assert stats["prefix_reused_tokens"] > (len(QUESTIONS) - 1) * system_tokens
