"""The tool-use task (a lookup tool over a table made for each episode): tables, splits, the tools, the reward,
and its workflow through a real server on the tiny model, with the tool results and the merged samples
recorded in the store."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentjet import SwarmClient
from agentjet.client.runner import run_workflow
from agentjet.engines.base import FinishReason, GenerationResult, SamplingParams, TrainSample
from agentjet.generators.hf import ContinuousHFGenerator, load_policy_model
from agentjet.layouts.composed import ComposedEngine
from agentjet.learners import InProcessLearner
from agentjet.settings import GeneratorSettings, LearnerSettings, LossSettings
from agentjet.tasks import get_task, lookup
from agentjet.weights.sync import InPlace

ROOT = Path(__file__).resolve().parents[1]


def test_tables_and_splits_are_fresh_deterministic_and_disjoint() -> None:
    train = lookup.generate_tasks("train", lookup.TRAIN_TABLES, seed=0)
    ev = lookup.generate_tasks("eval", lookup.EVAL_TABLES, seed=0)
    assert len({t["task_id"] for t in train}) == lookup.TRAIN_TABLES  # every train table once
    assert {t["task_id"] for t in train}.isdisjoint({t["task_id"] for t in ev})
    assert lookup.generate_tasks("eval", lookup.EVAL_TABLES, seed=0) == ev
    assert lookup.generate_tasks("train", 8, seed=1) != lookup.generate_tasks("train", 8, seed=0)
    assert len({json.dumps(t["table"], sort_keys=True) for t in train}) == lookup.TRAIN_TABLES  # fresh tables
    for t in train[:50] + ev:
        assert len(t["table"]) == lookup.TABLE_SIZE and t["item"] in t["table"]
        assert t["answer"] == t["table"][t["item"]]["code"] and re.fullmatch(r"\d{4}", t["answer"])
        assert len({row["code"] for row in t["table"].values()}) == lookup.TABLE_SIZE
        assert t["answer"] not in json.dumps(t["messages"])  # the question gives the code away nowhere
    assert get_task("lookup") is lookup
    with pytest.raises(ValueError, match="split"):
        lookup.generate_tasks("test", 1)
    with pytest.raises(ValueError, match="prompt"):
        lookup.make_task(0, prompt="nope")


def test_prompt_variants_name_the_item_and_carry_the_worked_example() -> None:
    task = lookup.make_task(5, "eval", prompt="parts_words")
    color, number = task["item"].split("-")
    question = task["messages"][-1]["content"]
    assert f"the {color} item with number {lookup.NUMBER_WORDS[int(number)]}" in question
    assert task["item"] not in question  # the agent must build the tool's argument itself
    roles = [m["role"] for m in task["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]  # one worked episode
    assert lookup.make_task(5, "eval", prompt="plain")["messages"][-1]["content"].endswith(f"item {task['item']}?")
    assert [m["role"] for m in lookup.make_task(5, "eval", prompt="plain")["messages"]] == ["system", "user"]
    assert "<tool_call>" in lookup.make_task(5, "eval", prompt="system_example")["messages"][0]["content"]
    both = lookup.make_task(5, "eval", prompt="fewshot_both")["messages"]
    assert sorted(m["tool_calls"][0]["function"]["name"] for m in both if m.get("tool_calls")) == ["lookup", "price"]


def test_tools_reward_and_correct_calls() -> None:
    task = lookup.make_task(0, "train")
    item, code = task["item"], task["answer"]
    right = lookup.parse_call("lookup", json.dumps({"item": item}))
    assert lookup.run_tool(task, right) == code and lookup.is_correct(task, right)
    upper = lookup.parse_call("lookup", json.dumps({"item": f" {item.upper()} "}))
    assert lookup.run_tool(task, upper) == code and lookup.is_correct(task, upper)
    price = lookup.parse_call("price", json.dumps({"item": item}))
    assert lookup.run_tool(task, price) == task["table"][item]["price"] and not lookup.is_correct(task, price)
    other = next(i for i in task["table"] if i != item)
    wrong_item = lookup.parse_call("lookup", json.dumps({"item": other}))
    assert not lookup.is_correct(task, wrong_item)
    missing = lookup.run_tool(task, lookup.parse_call("lookup", json.dumps({"item": "navy-0"})))
    assert missing.startswith("error") and all(i in missing for i in task["table"])
    for bad in ("{not json", "[1]", json.dumps({"name": item}), json.dumps({"item": 7})):
        call = lookup.parse_call("lookup", bad)
        assert not call.valid and not lookup.is_correct(task, call) and lookup.run_tool(task, call).startswith("error")
    assert lookup.run_tool(task, lookup.parse_call("calculator", "{}")).startswith("error: unknown tool")
    assert lookup.reward(task, code) == 1.0 and lookup.reward(task, f"The code of {item} is {code}.") == 1.0
    assert lookup.reward(task, f"{code} or 1234") == 0.0 and lookup.reward(task, "5172") == 0.0
    assert lookup.reward(task, "") == 0.0 and lookup.reward(task, code[:3]) == 0.0


class FirstCallScripted(ContinuousHFGenerator):
    """The tiny random model, except that an agent's first call (the prompt ends with the question) gets the
    right ``lookup`` call, scored by the model itself (its logprobs under the current weights, from the learner
    that shares them): the random model never writes a parseable tool call, and the test needs tool results in
    the episode."""

    scorer: InProcessLearner

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, on_token: Any = None
                       ) -> GenerationResult:
        last_turn = self.tokenizer.decode(prompt_ids).rsplit("<|im_start|>user\n", 1)[1]
        if "<|im_start|>tool" in last_turn:  # the tool answered: the model's own turn
            return await super().generate(prompt_ids, sampling, on_token)
        color, word = re.search(r"the (\w+) item with number (\w+)\?", last_turn).groups()
        call = {"name": "lookup", "arguments": {"item": f"{color}-{lookup.NUMBER_WORDS.index(word)}"}}
        ids = self.tokenizer.encode(f"<tool_call>\n{json.dumps(call)}\n</tool_call>", add_special_tokens=False)
        ids.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        n = len(prompt_ids)
        sample = TrainSample(prompt_ids + ids, [0] * n + [1] * len(ids), [0.0] * (n + len(ids)),
                             [0.0] * (n + len(ids)), temperature=sampling.temperature)
        logprobs = (await self.scorer.score([sample]))[0]
        return GenerationResult(ids, logprobs, FinishReason.STOP, self.policy_version,
                                text=self.tokenizer.decode(ids, skip_special_tokens=True))


def scripted_engine(model: Any) -> ComposedEngine:
    """The single-process layout with the scripted generator."""
    policy = load_policy_model(model)
    generator = FirstCallScripted(policy, GeneratorSettings(max_batch_size=8))
    generator.scorer = InProcessLearner(policy, LearnerSettings(), LossSettings(), worker=generator.worker)
    return ComposedEngine(generator, generator.scorer, InPlace())


def test_workflow_on_the_tiny_model_records_tool_results_and_merged_samples(make_server, tiny_model_path) -> None:
    srv = make_server(engine=scripted_engine(tiny_model_path))
    tasks = lookup.generate_tasks("train", 2)
    traces: dict[str, lookup.EpisodeTrace] = {}
    episodes: dict[str, dict[str, Any]] = {}

    async def workflow(task: dict[str, Any], ep: Any) -> float:
        trace = traces[ep.episode_id] = lookup.EpisodeTrace()
        episodes[ep.episode_id] = task
        return await lookup.rollout(task, ep, {"temperature": 0.7, "max_tokens": 24}, trace=trace)

    async def main() -> Any:
        async with SwarmClient(srv.url) as client:
            return await run_workflow(client, workflow, tasks, group_size=2, concurrency=4)

    summary = asyncio.run(main())
    assert summary.failed == 0 and summary.episodes == 4 and len(traces) == 4
    # every episode: the right call, its result (the code) back, then the tiny model's own turn(s)
    assert summary.calls == sum(t.turns for t in traces.values()) and summary.calls >= 2 * summary.episodes
    assert summary.samples == summary.episodes  # timeline merging: one training sample per episode
    tok = srv.server.engine.tokenizer
    for eid, trace in traces.items():
        task = episodes[eid]
        assert trace.called_correctly(task) and trace.transcript[0].endswith(f"-> {task['answer']}")
        [sample] = srv.server.store.samples_for([eid])[eid]
        assert sample.call_indices == list(range(trace.turns))  # all the episode's calls, merged
        assert srv.server.store.tracking_report(eid)["retokenize_failures"] == 0
        text = tok.decode(sample.input_ids)
        assert f"<|im_start|>tool\n{task['answer']}<|im_end|>" in text  # the tool result, recorded
        trained = tok.decode([t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m])
        assert f'"item": "{task["item"]}"' in trained and task["answer"] not in trained  # tool output masked
        assert all(lp < 0 for lp, m in zip(sample.behaviour_logprobs, sample.loss_mask, strict=True) if m)
    st = srv.server.reader.count_by_status()
    assert st["pending"] + st["dropped_uniform"] + st["trained"] == 4


def test_lookup_example_through_ajet_run(make_server) -> None:
    """The copyable example runs as a workflow file; every episode's calls merge into one sample."""
    task = json.loads((ROOT / "examples/data/lookup.jsonl").read_text().splitlines()[0])
    reply = f'<tool_call>\n{{"name": "lookup", "arguments": {{"item": "{task["item"]}"}}}}\n</tool_call>'
    srv = make_server(reply=reply)  # the agent calls the tool every turn and never answers
    out = subprocess.run([sys.executable, "-m", "agentjet.cli", "run", str(ROOT / "examples/lookup_agent.py:workflow"),
                          "--server", srv.url, "--dataset", str(ROOT / "examples/data/lookup.jsonl"), "--limit", "2",
                          "--group-size", "2"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "4 episodes, 0 failed" in out.stdout
    assert f"{4 * lookup.MAX_TURNS} chat calls -> 4 training samples" in out.stdout
    text = srv.server.engine.tokenizer.decode(srv.server.engine.generator.prompts[-1])
    assert "<tools>" in text and '"name": "price"' in text  # both tools described to a template without tools


def test_examples_dataset_is_the_tasks_train_split() -> None:
    lines = (ROOT / "examples/data/lookup.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == lookup.generate_tasks("train", len(lines), seed=0)


@pytest.mark.server
def test_demo_records_tool_use_and_transcripts_at_each_eval(tiny_model_path: Path, tmp_path: Path) -> None:
    """``ajet demo --task lookup`` on the tiny model: every held-out eval reports its tool use, and the first
    and last evals keep transcripts (what the 20-minute runs report)."""
    from rich.console import Console

    from agentjet.apps.demo import DemoSettings, run_demo
    from agentjet.client.settings import RunSettings

    console = Console(record=True, width=200)
    result = run_demo(DemoSettings(model=str(tiny_model_path), task="lookup", eval_tasks=4, out_dir=tmp_path / "demo",
                                   early_stop=False, seed=3,
                                   run=RunSettings(concurrency=4, time_budget_s=5, eval_every_s=0)), console)
    assert len(result.tool_use) == len(result.evals) == 2
    for row, ev in zip(result.tool_use, result.evals, strict=True):
        assert row["episodes"] == 4 and row["success"] == pytest.approx(ev.reward)
        assert 0.0 <= row["correct_call_share"] <= row["tool_call_share"] <= 1.0 and row["turns_per_episode"] >= 1
    assert set(result.transcripts) == {"before", "after"}
    assert [t["task_id"] for t in result.transcripts["before"]] == [f"lookup-eval-{i}" for i in
                                                                    _eval_indices(4)]
    assert all(t["transcript"] for t in result.transcripts["after"])  # each holds the agent's turns
    saved = json.loads((tmp_path / "demo" / "demo_result.json").read_text())
    assert saved["tool_use"] == result.tool_use and "correctly" in console.export_text()
    import yaml

    assert yaml.safe_load((tmp_path / "demo" / "server.yaml").read_text())["generator"]["seed"] == 3  # --seed
    server = saved["settings"]["server"]  # the result records the server's settings, the loss config included
    assert server["generator"]["seed"] == 3 and server["loss"]["clip_eps_low"] > 0
    assert set(str(server.get("admin_token", "*"))) == {"*"}  # masked


def _eval_indices(n: int) -> list[int]:
    return [int(t["task_id"].rsplit("-", 1)[1]) for t in lookup.generate_tasks("eval", n, seed=0)]
