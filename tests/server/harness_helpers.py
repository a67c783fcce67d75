"""What the harness API tests share: a scripted generator (the tiny tokenizer, replies chosen by how many tool
results the prompt holds) whose tool-call replies are written exactly as the server re-renders them, so that a
tool loop through any API merges into one sample; and a generator wrapper that keeps every result the engine
produced (the trace must hold these ids, not a re-tokenization)."""

from __future__ import annotations

import json
from typing import Any

from agentjet.engines.base import GenerationResult, SamplingParams, TokenCallback
from agentjet.layouts.null import NullGenerator, NullLearner, compose_null
from agentjet.server.episodes.chat import ChatFormatter, normalize_messages

TOOL_RESULT = "RESULT-7431"  # what the scripted tool returns: its count in a prompt picks the reply


def tool_call_text(tokenizer: Any, name: str, arguments: dict[str, Any], content: str = "") -> str:
    """The text of an assistant turn calling ``name``, exactly as the server renders that turn back (the chat
    template's rendering after the generation prompt, up to the end-of-turn token)."""
    fmt = ChatFormatter(tokenizer)
    user = [{"role": "user", "content": "x"}]
    msg = {"role": "assistant", "content": content or None,
           "tool_calls": [{"id": "c0", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}
    head = tokenizer.apply_chat_template(fmt.render_messages(user, None), add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(fmt.render_messages(normalize_messages([*user, msg]), None), tokenize=False)
    assert full.startswith(head)
    region = full[len(head):]
    return region[: region.index(tokenizer.eos_token)]


class ScriptedGenerator(NullGenerator):
    """Reply ``replies[k]`` to a prompt that holds ``TOOL_RESULT`` k times (the last reply beyond); every result is
    kept in ``results``."""

    def __init__(self, tokenizer: Any, replies: list[str], reply_ids: list[list[int]] | None = None) -> None:
        super().__init__(tokenizer, replies[0])
        self.replies = [list(tokenizer.encode(r, add_special_tokens=False)) + [tokenizer.eos_token_id]
                        for r in replies] if reply_ids is None else [ids + [tokenizer.eos_token_id] for ids in reply_ids]
        self.results: list[GenerationResult] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, on_token: TokenCallback | None = None,
                       adapter: str | None = None) -> GenerationResult:
        seen = self.tokenizer.decode(prompt_ids).count(TOOL_RESULT)
        self.reply_ids = self.replies[min(seen, len(self.replies) - 1)]
        result = await super().generate(prompt_ids, sampling, on_token, adapter)
        self.results.append(result)
        return result


def scripted_engine(tokenizer: Any, replies: list[str], reply_ids: list[list[int]] | None = None) -> Any:
    return compose_null(ScriptedGenerator(tokenizer, replies, reply_ids), NullLearner())


class Recording:
    """Wraps an engine's generator: every ``GenerationResult`` it returns is kept, in order."""

    def __init__(self, engine: Any) -> None:
        self.results: list[GenerationResult] = []
        real = engine.generator.generate

        async def generate(*args: Any, **kwargs: Any) -> GenerationResult:
            result = await real(*args, **kwargs)
            self.results.append(result)
            return result

        engine.generator.generate = generate


def trace(srv: Any, episode_id: str) -> dict[str, Any]:
    import httpx

    r = httpx.get(f"{srv.url}/swarm/v1/episodes/{episode_id}/trace", headers={"Authorization": "Bearer adm1n"})
    assert r.status_code == 200, r.text
    return r.json()


def generated_spans(tr: dict[str, Any]) -> list[tuple[str, list[int]]]:
    """Each call's generated ids in the trace's samples, with its API, in call order."""
    spans = []
    for s in tr["samples"]:
        for c in s["calls"]:
            a, b = c["generated"]
            spans.append((c["call_index"], c["api"], s["token_ids"][a:b]))
    return [(api, ids) for _, api, ids in sorted(spans)]
