"""The lookup task through the harness APIs (``agentjet.tasks.lookup_harness``): the worked examples go in as each
API's own history and come out of the server's translation as the chat agent's messages (so every arm sees the
same prompt), and each agent (the OpenAI Agents SDK's ``Runner.run``, the Anthropic SDK's tool loop) finds the
code through a live server, its episode one merged sample."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from agentjet import SwarmClient
from agentjet.client.runner import run_workflow, task_workflow
from agentjet.engines.base import GenerationResult, SamplingParams
from agentjet.layouts.null import NullGenerator, NullLearner, compose_null
from agentjet.server.episodes.chat import normalize_messages
from agentjet.server.http.anthropic_api import chat_messages
from agentjet.server.http.responses_api import input_messages
from agentjet.tasks import get_task, lookup, lookup_harness


@pytest.mark.parametrize("prompt", ["fewshot_both", "parts_words"])
def test_each_apis_history_translates_back_to_the_chat_agents_messages(prompt: str) -> None:
    task = lookup.make_task(3, "train", prompt)
    after_system = task["messages"][1:]
    want = normalize_messages(after_system)
    assert normalize_messages(input_messages(lookup_harness.responses_items(after_system))) == want
    assert normalize_messages(chat_messages(lookup_harness.anthropic_messages(after_system))) == want
    assert get_task("lookup-agents") is lookup_harness.AGENTS and get_task("lookup-anthropic").rollout is \
        lookup_harness.anthropic_rollout


class RightAgent(NullGenerator):
    """Calls ``lookup`` for the asked item, then answers with the code the tool returned (the tiny template)."""

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, on_token: Any = None,
                       adapter: str | None = None) -> GenerationResult:
        last_turn = self.tokenizer.decode(prompt_ids).rsplit("<|im_start|>user\n", 1)[1]
        tool = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", last_turn)
        if tool:
            reply = tool[-1]
        else:
            color, word = re.search(r"the (\w+) item with number (\w+)\?", last_turn).groups()
            call = {"name": "lookup", "arguments": {"item": f"{color}-{lookup.NUMBER_WORDS.index(word)}"}}
            reply = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        self.reply_ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return await super().generate(prompt_ids, sampling, on_token, adapter)


@pytest.mark.parametrize("name", ["lookup-agents", "lookup-anthropic"])
def test_the_harness_agent_finds_the_code_and_its_episode_is_one_sample(make_server, tiny_model_path,
                                                                        name: str) -> None:
    from transformers import AutoTokenizer

    srv = make_server(compose_null(RightAgent(AutoTokenizer.from_pretrained(tiny_model_path)), NullLearner()))
    source = get_task(name)
    tasks = [{**t, "index": i} for i, t in enumerate(source.generate_tasks("eval", 2))]
    traces: list[tuple[dict[str, Any], Any]] = []

    async def main() -> Any:
        async with SwarmClient(srv.url) as client:
            return await run_workflow(client, task_workflow(source, source.EVAL_SAMPLING, traces=traces), tasks,
                                      group_size=1, concurrency=2, eval=True)

    summary = asyncio.run(main())
    assert summary.failed == 0 and summary.episodes == 2 and summary.mean_reward == 1.0
    assert summary.samples == summary.episodes and summary.calls == 4  # a call and an answer, merged
    row = source.tool_use_summary([t for t, _ in traces], [tr for _, tr in traces])
    assert row["success"] == row["tool_call_share"] == row["correct_call_share"] == 1.0
    assert row["turns_per_episode"] == 2.0
    api = {"lookup-agents": "responses", "lookup-anthropic": "messages"}[name]
    stored = srv.server.store.samples_for([ep.episode_id for ep in srv.server.registry.episodes()])
    spans = [sp for samples in stored.values() for s in samples for sp in s.stats["call_spans"]]
    assert len(spans) == 4 and {sp["api"] for sp in spans} == {api}


def test_the_learning_benchmark_builds_each_arms_demo() -> None:
    """benchmarks/learning/harness_lookup.py makes a valid ``ajet demo`` for each arm (the budget in the run's
    settings, the task's recommendations for the rest), so it cannot rot unseen as the demo's settings move."""
    import argparse
    import importlib.util
    from pathlib import Path

    from agentjet.apps.demo import run_settings
    from agentjet.tasks import get_task

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "learning" / "harness_lookup.py"
    spec = importlib.util.spec_from_file_location("harness_lookup_bench", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = argparse.Namespace(model="tiny-random", minutes=8.0, eval_tasks=None, seed=3, out_dir=Path("/tmp/x"))
    for arm in bench.ARMS:
        s = bench.arm_settings(arm, args)
        run = run_settings(s, get_task(arm).RECOMMENDED)
        assert (s.task, s.early_stop, s.seed, run.time_budget_s) == (arm, False, 3, 480.0)
        assert run.group_size == get_task(arm).RECOMMENDED.group_size
