"""The real CLIs against a live `ajet server` (opt-in: `make test-harnesses`): `codex exec` (Codex CLI 0.169.0, the
Responses API) and `claude -p` (Claude Code 2.1.328, Anthropic's Messages API) each run one task of
examples/data/workspace.jsonl to its end through the examples' own workflows, on tiny-random-64k (their prompts
are 7-10k tokens; the model's replies are random text, so the task is not solved: the point is the protocol).

For each: the CLI exits 0; every model call it made was answered 200 and streamed; the episode is acknowledged with
the reward the directory check gave; the trace holds every call, through that API, with the engine's own tokens
(each call's prompt is the one the engine received, longer than tiny-random's 4,096 positions); and the CLI tried no
connection beyond this machine. The figures (calls, prompt tokens per call, merged vs unmerged training tokens,
seconds) are printed as one JSON line per CLI (`pytest -s`), and appended to $AGENTJET_HARNESS_FIGURES when set
(docs/harnesses.md's figures)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import pytest
from tests.harnesses.conftest import ROOT, LiveServer, example
from tests.harnesses.helpers import NetTrap

from agentjet import SwarmClient
from agentjet.client.runner import RunSummary, run_workflow

pytestmark = [pytest.mark.harnesses, pytest.mark.server]

FIGURES_ENV = "AGENTJET_HARNESS_FIGURES"  # a file to append each run's figures to
CLAUDE_RESUMES = 3  # Claude Code 2.1.328 resumes a reply cut at max_tokens this many times
TASKS = {t["task_id"]: t for t in map(json.loads, (ROOT / "examples/data/workspace.jsonl").read_text().splitlines())}


def run_one(live: LiveServer, workflow: Any, task: dict[str, Any]) -> tuple[RunSummary, str, list[Any], float]:
    """One episode of ``task`` through ``workflow``: the run's summary, the episode id, the calls the proxy saw
    during it, the seconds it took."""
    ids: list[str] = []
    before = len(live.proxy.calls)

    async def recorded(task: dict[str, Any], ep: Any) -> float:
        ids.append(ep.episode_id)
        return float(await workflow(task, ep))

    async def main() -> RunSummary:
        async with SwarmClient(live.url) as client:
            return await run_workflow(client, recorded, [task], concurrency=1)

    start = time.monotonic()
    summary = asyncio.run(main())
    seconds = time.monotonic() - start
    assert len(ids) == 1
    return summary, ids[0], live.proxy.calls[before:], seconds


def check_run(live: LiveServer, trap: NetTrap, name: str, workflow: Any, task: dict[str, Any], route: str,
              api: str, exits_ok: bool = True, reward: float = 0.0) -> dict[str, Any]:
    """One task of ``name`` through ``workflow``, checked; its figures. ``exits_ok``: the CLI exits 0 (else the
    caller checks its exit code, in the figures). ``reward``: what the directory check gives (0.0: random text
    writes no hello.txt)."""
    summary, episode_id, calls, seconds = run_one(live, workflow, task)
    assert (summary.episodes, summary.failed) == (1, 0), summary.failure_kinds
    model_calls = [c for c in calls if c.is_model_call]
    assert model_calls, f"{name} made no model call"
    assert {c.route for c in model_calls} == {route}
    bad = [(c.path, c.status, c.client_gone, c.response[-400:]) for c in model_calls
           if c.status != 200 or not c.streamed or c.client_gone]
    assert not bad, f"every model call is answered 200 and streamed: {bad}"
    trace = live.trace(episode_id)
    returncode = trace["metadata"]["harness_returncode"]
    assert returncode == 0 or not exits_ok, f"{name} exited with {returncode} (its output is in the log above)"
    assert trace["reward"] == summary.rewards[0] == reward
    assert trace["calls"] == len(model_calls), "the trace holds every call"
    recorded = [call for sample in trace["samples"] for call in sample["calls"]]
    assert sorted(c["call_index"] for c in recorded) == list(range(len(model_calls)))
    assert {c["api"] for c in recorded} == {api}
    prompts = []
    for sample in trace["samples"]:
        for call in sample["calls"]:
            start, end = call["prompt"]
            gen_start, gen_end = call["generated"]
            assert call["exact_context"] and gen_end > gen_start and sample["loss_mask"][gen_start] == 1
            prompts.append(end - start)
    assert min(prompts) > 4096, "a harness's prompt is longer than tiny-random's context"
    assert trap.attempts == [], f"{name} tried to reach beyond this machine: {trap.attempts}"
    report = trace["report"]
    figures = {"cli": name, "task": task["task_id"], "returncode": returncode, "calls": len(model_calls),
               "prompt_tokens": prompts,
               "request_kb": [round(c.request_bytes / 1024, 1) for c in model_calls],
               "tokens_unmerged": report["tokens_unmerged"], "tokens_merged": report["tokens_merged"],
               "samples": len(trace["samples"]), "seconds": round(seconds, 1),
               "call_seconds": [round(c.seconds, 1) for c in model_calls]}
    print(json.dumps(figures))
    if os.environ.get(FIGURES_ENV):  # one JSON line per run, appended (docs/harnesses.md's figures)
        with open(os.environ[FIGURES_ENV], "a") as out:
            out.write(json.dumps(figures) + "\n")
    return figures


def test_codex_exec_runs_a_task_to_its_end(live_server: LiveServer, codex_bin: str, net_trap: NetTrap) -> None:
    check_run(live_server, net_trap, "codex exec", example("codex_task").workflow, TASKS["hello-file"],
              "/v1/responses", "responses")


def test_claude_p_runs_a_task_to_its_end(live_server: LiveServer, claude_bin: str, net_trap: NetTrap) -> None:
    """No output cap: Claude Code asks for 32,000 tokens on every call, and the server clamps that to the room left
    in the model's context."""
    figures = check_run(live_server, net_trap, "claude -p", example("claude_code_task").workflow,
                        TASKS["hello-file"], "/v1/messages", "messages")
    asked = {c.request["max_tokens"] for c in live_server.proxy.model_calls()[-figures["calls"]:]}
    assert asked == {32000}


def test_claude_p_continues_a_cut_reply_in_one_timeline(live_server: LiveServer, claude_bin: str,
                                                        net_trap: NetTrap) -> None:
    """With a small output cap (CLAUDE_CODE_MAX_OUTPUT_TOKENS, through the task's max_output_tokens) a reply that
    hits it ends with stop_reason max_tokens, and Claude Code asks the model to resume, up to 3 times, then gives the
    run up as an error (exit 1). Each call resends the whole conversation, and timeline merging trains them as one
    sample. (A reply may end by itself within the cap, about 1 in 8 here: then the run ends there, with exit 0.)"""
    task = {**TASKS["hello-file"], "max_output_tokens": 8}
    figures = check_run(live_server, net_trap, "claude -p (8-token cap)", example("claude_code_task").workflow, task,
                        "/v1/messages", "messages", exits_ok=False)
    calls = live_server.proxy.model_calls()[-figures["calls"]:]
    stops = [_message_stop_reason(c.response) for c in calls]
    assert stops[:-1] == ["max_tokens"] * (len(calls) - 1)  # each resume follows a cut reply
    if stops[-1] == "max_tokens":
        assert len(calls) == 1 + CLAUDE_RESUMES and figures["returncode"] == 1
    else:
        assert stops[-1] == "end_turn" and figures["returncode"] == 0
    if len(calls) > 1:
        assert figures["samples"] == 1 and figures["tokens_merged"] < figures["tokens_unmerged"]


def _message_stop_reason(stream: bytes) -> str | None:
    for line in stream.decode().splitlines():
        if line.startswith("data:") and '"message_delta"' in line:
            return json.loads(line[5:])["delta"]["stop_reason"]
    return None



def sdk_workflow(claude: Any) -> Any:
    """The Claude Agent SDK's ``query()`` driving the Claude Code it bundles (2.1.328), with the claude example's
    permission and offline settings, as a workflow."""
    from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, query

    from agentjet.client.workspace import Workspace
    from agentjet.tasks.workspace import check

    async def workflow(task: dict[str, Any], ep: Any) -> float:
        with Workspace(task) as ws:
            # options.env is laid over this process's environment: blank a key the parent may hold
            env = {**ep.env(base=ws.base_env(claude.claude_env(task))), "ANTHROPIC_API_KEY": ""}
            options = ClaudeAgentOptions(cwd=str(ws.dir), env=env, permission_mode="acceptEdits",
                                         extra_args={"restricted": None, "permission-prompts": "none",
                                                     "no-session-persistence": None})
            results = [m async for m in query(prompt=task["prompt"], options=options) if isinstance(m, ResultMessage)]
            reward = check(task, ws.dir)
        assert len(results) == 1 and not results[0].is_error, results
        ep.reward(reward, harness_returncode=0)
        return reward

    return workflow


def test_the_claude_agent_sdk_runs_a_task_to_its_end(live_server: LiveServer, net_trap: NetTrap) -> None:
    pytest.importorskip("claude_agent_sdk", reason="the harnesses extra: make setup-harnesses")
    claude = example("claude_code_task")
    # the example's permission flags, as sdk_workflow passes them to the SDK
    assert claude.PERMISSIONS == ["--restricted", "--permission-mode", "acceptEdits", "--permission-prompts", "none"]
    check_run(live_server, net_trap, "claude-agent-sdk query()", sdk_workflow(claude), TASKS["hello-file"],
              "/v1/messages", "messages")
