"""The real CLIs through a whole tool loop on the swarm server (opt-in: `make test-harnesses`). A random model never
writes a tool call, so here a scripted policy stands in for the model: the generator answers a task's first call
with a tool call in the model family's own format (`<tool_call>{...}</tool_call>`, SmolLM2's tokenizer and
template, as tiny-random-64k has) and a call whose prompt holds that tool's result with "Done.". Everything else is
real: the server (in process, over HTTP) parses the call into the API's function_call / tool_use, the CLI runs it
inside its sandbox, sends the result back with its whole history, and the examples' workflows score the directory.

For each CLI: the task is solved (reward 1.0 from the directory check), two model calls, both 200 and streamed, and
timeline merging trains them as one sample: the second call's prompt holds the first call's generated ids exactly."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests.harnesses.conftest import ADMIN, LiveServer, example
from tests.harnesses.helpers import NetTrap, RecordingProxy
from tests.harnesses.test_real_clis import TASKS, check_run

from agentjet.engines.base import GenerationResult, SamplingParams, TokenCallback
from agentjet.layouts.null import NullGenerator, NullLearner, compose_null
from agentjet.models import TINY_64K_POSITIONS, TINY_RANDOM_64K, resolve_model

pytestmark = [pytest.mark.harnesses, pytest.mark.server]

CODEX_RESULT = "Process exited with code 0"  # what Codex's exec_command returns, and Claude Code's Write
CLAUDE_RESULT = "File created successfully"
WORKDIR = re.compile(r"Primary working directory: (\S+)")  # in Claude Code's system prompt


class ScriptedPolicy(NullGenerator):
    """A stand-in model with a 64k context: ``call(prompt_text)`` (a tool call, as the model would write it) until
    the prompt holds one of ``results``, then "Done."."""

    def __init__(self, tokenizer: Any, call: Callable[[str], str], results: tuple[str, ...]) -> None:
        super().__init__(tokenizer)
        self.call, self.results = call, results

    @property
    def max_context(self) -> int:
        return TINY_64K_POSITIONS

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, on_token: TokenCallback | None = None,
                       adapter: str | None = None) -> GenerationResult:
        text = self.tokenizer.decode(prompt_ids)
        reply = "Done." if any(r in text for r in self.results) else self.call(text)
        self.reply_ids = list(self.tokenizer.encode(reply, add_special_tokens=False)) + [self.tokenizer.eos_token_id]
        return await super().generate(prompt_ids, sampling, on_token, adapter)


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture
def scripted_server(make_server: Any) -> Iterator[Callable[[ScriptedPolicy], LiveServer]]:
    proxies: list[RecordingProxy] = []

    def start(policy: ScriptedPolicy) -> LiveServer:
        proxy = RecordingProxy().start()
        proxies.append(proxy)
        srv = make_server(compose_null(policy, NullLearner()), public_url=proxy.url, admin_token=ADMIN,
                          training={"group_size": 1, "min_group_size": 1})
        proxy.upstream = srv.url
        return LiveServer(srv.url, proxy)

    yield start
    for proxy in proxies:
        proxy.stop()


def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(TINY_RANDOM_64K))


def check_loop(live: LiveServer, trap: NetTrap, name: str, workflow: Any, route: str, api: str) -> None:
    figures = check_run(live, trap, name, workflow, TASKS["hello-file"], route, api, reward=1.0)
    assert figures["calls"] == 2 and figures["samples"] == 1, figures
    assert figures["tokens_merged"] < figures["tokens_unmerged"]


def test_codex_exec_runs_a_tool_and_solves_the_task(scripted_server: Any, codex_bin: str, net_trap: NetTrap) -> None:
    policy = ScriptedPolicy(tokenizer(), lambda _: tool_call("exec_command", {"cmd": "echo hi > hello.txt"}),
                            (CODEX_RESULT,))
    check_loop(scripted_server(policy), net_trap, "codex exec (scripted tool loop)",
               example("codex_task").workflow, "/v1/responses", "responses")


def test_claude_p_runs_a_tool_and_solves_the_task(scripted_server: Any, claude_bin: str, net_trap: NetTrap) -> None:
    def write(prompt: str) -> str:
        found = WORKDIR.search(prompt)
        assert found, "Claude Code's prompt names its working directory"
        return tool_call("Write", {"file_path": f"{found.group(1)}/hello.txt", "content": "hi"})

    policy = ScriptedPolicy(tokenizer(), write, (CLAUDE_RESULT,))
    check_loop(scripted_server(policy), net_trap, "claude -p (scripted tool loop)",
               example("claude_code_task").workflow, "/v1/messages", "messages")
