"""What a harness run as a subprocess (Codex CLI, Claude Code, the Claude Agent SDK, anything that reads the
OpenAI or Anthropic environment variables) needs to make its model calls on one episode: ``Episode.env()``.

- OpenAI clients: ``OPENAI_BASE_URL`` (``.../v1``) and ``OPENAI_API_KEY`` (the episode key).
- Anthropic clients: ``ANTHROPIC_BASE_URL`` (no ``/v1``: the client appends ``/v1/messages``),
  ``ANTHROPIC_AUTH_TOKEN`` (sent as a bearer token), ``ANTHROPIC_MODEL`` and the model Claude Code uses for its
  small background calls, all the served model (so they are this episode's agent, not an agent per model name).
  ``ANTHROPIC_API_KEY`` is removed: an Anthropic client would send it instead of the episode key.
- Codex CLI: ``CODEX_HOME``, a directory holding a ``config.toml`` whose model provider ``agentjet`` points at
  the server with ``wire_api = "responses"`` and takes its key from ``OPENAI_API_KEY``. Sandbox and approval
  settings are the caller's (``codex exec -c sandbox_mode=...``).
- ``agent``: the agent name of every call (``X-Agent-Name``), through Codex's ``http_headers`` and Claude Code's
  ``ANTHROPIC_CUSTOM_HEADERS``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from agentjet.protocol import AGENT_HEADER

CODEX_PROVIDER = "agentjet"
CLAUDE_MODEL_VARS = ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                     "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL")


def _toml(value: str) -> str:
    """A TOML basic string (JSON's string escapes are TOML's)."""
    return json.dumps(value)


def codex_config(base_url: str, model: str, agent: str | None = None) -> str:
    """``config.toml`` for Codex CLI: the served model through the provider ``agentjet`` (Responses API)."""
    lines = [f"model = {_toml(model)}", f"model_provider = {_toml(CODEX_PROVIDER)}", "",
             f"[model_providers.{CODEX_PROVIDER}]", 'name = "AgentJet"', f"base_url = {_toml(base_url)}",
             'env_key = "OPENAI_API_KEY"', 'wire_api = "responses"']
    if agent:
        lines.append(f"http_headers = {{ {_toml(AGENT_HEADER)} = {_toml(agent)} }}")
    return "\n".join(lines) + "\n"


def harness_env(base: Mapping[str, str], *, base_url: str, anthropic_base_url: str, api_key: str, model: str,
                codex_home: Path, agent: str | None = None) -> dict[str, str]:
    """``base`` (the parent's environment, say) with the variables above; writes the provider into ``config.toml`` in ``codex_home``."""
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url, model, agent))
    env = {k: v for k, v in base.items() if k != "ANTHROPIC_API_KEY"}
    env.update({"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key, "ANTHROPIC_BASE_URL": anthropic_base_url,
                "ANTHROPIC_AUTH_TOKEN": api_key, "CODEX_HOME": str(codex_home)})
    env.update(dict.fromkeys(CLAUDE_MODEL_VARS, model))
    if agent:
        env["ANTHROPIC_CUSTOM_HEADERS"] = f"{AGENT_HEADER}: {agent}"
    return env
