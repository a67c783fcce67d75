"""The real CLIs, run with the examples' own commands, against a scripted logging stub (opt-in: `make
test-harnesses`). What these pin is the CLIs' side, not AgentJet's (the routes are tested against the live server
in test_real_clis.py): what each sends (route, headers, the body fields the routes must take), that it runs
offline, and that its own sandbox or permission settings keep the tool calls a model makes inside the task's
directory: the stub answers with tool calls that write inside and outside it, and run a shell command."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.harnesses.conftest import ROOT, example
from tests.harnesses.helpers import NetTrap, Reply, ScriptedStub

from agentjet.client.harness import harness_env
from agentjet.client.workspace import HarnessRun, Workspace

pytestmark = pytest.mark.harnesses

TASK = next(t for t in map(json.loads, (ROOT / "examples/data/workspace.jsonl").read_text().splitlines())
            if t["task_id"] == "hello-file")
KEY, MODEL = "sk-probe", "probe-model"


def run_against(stub: ScriptedStub, ws: Workspace, argv: list[str], extra_env: dict[str, str] | None = None
                ) -> HarnessRun:
    env = harness_env(ws.base_env(extra_env), base_url=f"{stub.url}/v1", anthropic_base_url=stub.url, api_key=KEY,
                      model=MODEL, codex_home=ws.scratch / "codex")
    stub.start()
    try:
        return asyncio.run(ws.run(argv, env, timeout_s=180))
    finally:
        stub.stop()


def outside_paths(tmp_path: Path) -> list[Path]:
    """Files a confined tool call must not create: beside the workspace (under /tmp) and outside /tmp."""
    return [tmp_path / "outside.txt", Path("/var/tmp") / f"agentjet-probe-{uuid.uuid4().hex}.txt"]


def test_codex_exec_sends_responses_offline_and_its_sandbox_keeps_commands_inside(
        codex_bin: str, net_trap: NetTrap, tmp_path: Path) -> None:
    codex = example("codex_task")
    outside = outside_paths(tmp_path)
    command = "echo hi > hello.txt; " + "; ".join(f"echo x > {p}" for p in outside)
    stub = ScriptedStub([Reply(tool="exec_command", arguments={"cmd": command}), Reply(text="done")])
    with Workspace(TASK) as ws:
        run = run_against(stub, ws, codex.codex_argv(codex_bin, ws.dir, TASK["prompt"]))
    assert run.returncode == 0, run.log_tail
    assert run.reward == 1.0  # the command ran, inside the directory
    assert not any(p.exists() for p in outside), "the sandbox let a command write outside the directory"
    assert net_trap.attempts == []
    posts = stub.posts()
    assert [p["path"] for p in posts] == ["/v1/responses", "/v1/responses"]
    first, second = (p["body"] for p in posts)
    headers = posts[0]["headers"]
    assert headers["authorization"] == f"Bearer {KEY}" and headers["accept"] == "text/event-stream"
    assert first["model"] == MODEL and first["stream"] is True and first["store"] is False
    # sent on every call, accepted and ignored by the route: reasoning, include, prompt_cache_key
    assert {"reasoning", "include", "prompt_cache_key", "tool_choice", "parallel_tool_calls"} <= first.keys()
    assert [(i["type"], i["role"]) for i in first["input"]] == [("message", "developer")] * 2 + [("message", "user")] * 2
    assert {t["type"] for t in first["tools"]} == {"function", "namespace"}  # no web_search: left out by the example
    assert "exec_command" in {t["name"] for t in first["tools"]}
    # the whole history again (store: false), the command's output as a function_call_output
    assert second["input"][: len(first["input"])] == first["input"]
    output = next(i for i in second["input"] if i["type"] == "function_call_output")["output"]
    assert output.count("Read-only file system") == len(outside)


def test_claude_p_sends_messages_offline_and_its_permissions_keep_tools_inside(
        claude_bin: str, net_trap: NetTrap, tmp_path: Path) -> None:
    claude = example("claude_code_task")
    outside = outside_paths(tmp_path)
    with Workspace(TASK) as ws:
        stub = ScriptedStub([Reply(tool="Write", arguments={"file_path": str(ws.dir / "hello.txt"), "content": "hi"}),
                             Reply(tool="Write", arguments={"file_path": str(outside[0]), "content": "x"}),
                             Reply(tool="Bash", arguments={"command": f"echo x > {outside[1]}", "description": "x"}),
                             Reply(text="done")])
        run = run_against(stub, ws, claude.claude_argv(claude_bin, TASK["prompt"]), claude.claude_env(TASK))
    assert run.returncode == 0, run.log_tail
    assert run.reward == 1.0  # the Write inside the directory went through
    assert not any(p.exists() for p in outside), "a tool call wrote outside the directory"
    assert net_trap.attempts == []
    posts = [p for p in stub.posts() if "count_tokens" not in p["path"]]
    assert [p["path"] for p in posts] == ["/v1/messages?beta=true"] * 4
    headers, body = posts[0]["headers"], posts[0]["body"]
    assert headers["Authorization"] == f"Bearer {KEY}" and headers["anthropic-version"] == "2023-06-01"
    assert "claude-code-20250219" in headers["anthropic-beta"].split(",")
    assert body["model"] == MODEL and body["stream"] is True and body["max_tokens"] == 32000
    # accepted and ignored by the route
    assert {"thinking", "context_management", "output_config", "metadata"} <= body.keys()
    assert len(body["system"]) == 3 and any("cache_control" in block for block in body["system"])
    assert "system" in {m["role"] for m in body["messages"]}  # a system-role message inside messages
    tools = {t["name"] for t in body["tools"]}
    assert {"Read", "Write", "Edit"} <= tools and "Bash" not in tools  # --restricted
    results = [_last_tool_result(p["body"]) for p in posts[1:]]
    assert results[0]["content"].startswith("File created successfully")
    assert results[1]["is_error"] and "outside" in results[1]["content"]
    assert results[2]["is_error"] and "No such tool available: Bash" in results[2]["content"]


def _last_tool_result(body: dict[str, Any]) -> dict[str, Any]:
    content = body["messages"][-1]["content"]
    return next(block for block in reversed(content) if block.get("type") == "tool_result")
