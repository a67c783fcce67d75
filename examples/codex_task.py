"""Codex CLI, unchanged, as the agent of a swarm episode: ``codex exec`` runs headless on a task in a directory of
its own, its model calls go to the episode through the Responses API, and the reward is a check of the directory
(``agentjet.tasks.workspace``), never the model's words.

    make setup-harnesses                                # Codex CLI 0.169.0 into .harnesses (npm, ~400 MB)
    ajet server --model tiny-random-64k    # the protocol only; to learn, a model with 32k+ positions (docs/harnesses.md)
    ajet run examples/codex_task.py:workflow --dataset examples/data/workspace.jsonl --group-size 4

``ep.env()`` hands Codex the episode: a ``CODEX_HOME`` whose ``config.toml`` makes the provider ``agentjet`` (the
server, ``wire_api = "responses"``) the model provider, with the episode key in ``OPENAI_API_KEY``. Codex's own
sandbox keeps what the model runs inside the directory: ``--sandbox workspace-write`` with ``/tmp`` and
``$TMPDIR`` taken out of the writable roots (only the directory is writable; no network for the commands), and
approval ``never`` (a command the sandbox refuses fails, and the model sees that). Offline: analytics, the plugin
sync (a ``git ls-remote`` of github.com/openai/plugins and api.github.com) and the update check are off. Left out:
the hosted ``web_search`` tool (no local model can run it; its sub-agent tools, sent as a ``namespace`` tool, are
served). ``$AGENTJET_CODEX`` names another codex.
"""

from __future__ import annotations

from pathlib import Path

from agentjet.client.workspace import Workspace, find_harness

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 900.0  # per task (a task may set "timeout_s")

SANDBOX = ["--sandbox", "workspace-write", "-c", 'approval_policy="never"',
           "-c", "sandbox_workspace_write.exclude_slash_tmp=true",
           "-c", "sandbox_workspace_write.exclude_tmpdir_env_var=true"]
OFFLINE = ["-c", "analytics.enabled=false", "-c", "check_for_update_on_startup=false", "--disable", "plugins"]
# The tool the server cannot serve: the hosted web_search (it runs on OpenAI's side; docs/harnesses.md).
SERVED_TOOLS = ["-c", 'web_search="disabled"']


def codex_argv(codex: str, workdir: Path, prompt: str) -> list[str]:
    """``codex exec``, headless, in ``workdir``, sandboxed to it and offline."""
    return [codex, "exec", "--skip-git-repo-check", "--ephemeral", "--color", "never", "--cd", str(workdir),
            *SANDBOX, *OFFLINE, *SERVED_TOOLS, "--", prompt]


async def workflow(task: dict, ep) -> float:
    codex = find_harness("codex", "AGENTJET_CODEX", ROOT / ".harnesses")
    with Workspace(task) as ws:
        env = ep.env(base=ws.base_env(), codex_home=ws.scratch / "codex")
        run = await ws.run(codex_argv(codex, ws.dir, task["prompt"]), env, float(task.get("timeout_s", TIMEOUT_S)))
    ep.reward(run.reward, **run.metadata())
    return run.reward
