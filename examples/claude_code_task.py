"""Claude Code, unchanged, as the agent of a swarm episode: ``claude -p`` runs headless on a task in a directory of
its own, its model calls go to the episode through Anthropic's Messages API, and the reward is a check of the
directory (``agentjet.tasks.workspace``), never the model's words.

    make setup-harnesses                                # Claude Code 2.1.328 into .harnesses (npm, ~360 MB)
    ajet server --model tiny-random-64k    # the protocol only; to learn, a model with 32k+ positions (docs/harnesses.md)
    ajet run examples/claude_code_task.py:workflow --dataset examples/data/workspace.jsonl --group-size 4

``ep.env()`` hands Claude Code the episode: ``ANTHROPIC_BASE_URL`` (the server), ``ANTHROPIC_AUTH_TOKEN`` (the
episode key, sent as a bearer token) and the served model as ``ANTHROPIC_MODEL`` and the small/fast model. Claude
Code's own permission settings keep it inside the directory: ``--restricted`` takes out the tools that run
commands (Bash and the like) and confines the file tools to the working directory, ``--permission-mode
acceptEdits`` lets it edit there without asking, and ``--permission-prompts none`` refuses whatever would ask.
Offline: ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`` (telemetry, error reports, the update check and the
connectivity probe off). A task's ``max_output_tokens`` sets ``CLAUDE_CODE_MAX_OUTPUT_TOKENS`` (Claude Code asks
for 32,000 on every call otherwise). ``$AGENTJET_CLAUDE`` names another claude.
"""

from __future__ import annotations

from pathlib import Path

from agentjet.client.workspace import Workspace, find_harness

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 900.0  # per task (a task may set "timeout_s")

PERMISSIONS = ["--restricted", "--permission-mode", "acceptEdits", "--permission-prompts", "none"]
OFFLINE_ENV = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
               "DISABLE_ERROR_REPORTING": "1"}


def claude_argv(claude: str, prompt: str) -> list[str]:
    """``claude -p``, headless, confined to its working directory, nothing saved for a later resume."""
    return [claude, "-p", *PERMISSIONS, "--no-session-persistence", "--output-format", "json", "--", prompt]


def claude_env(task: dict) -> dict[str, str]:
    """The variables Claude Code reads besides the episode's own."""
    limit = task.get("max_output_tokens")
    return {**OFFLINE_ENV, **({"CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(int(limit))} if limit else {})}


async def workflow(task: dict, ep) -> float:
    claude = find_harness("claude", "AGENTJET_CLAUDE", ROOT / ".harnesses")
    with Workspace(task) as ws:
        env = ep.env(base=ws.base_env(claude_env(task)))
        run = await ws.run(claude_argv(claude, task["prompt"]), env, float(task.get("timeout_s", TIMEOUT_S)))
    ep.reward(run.reward, **run.metadata())
    return run.reward
