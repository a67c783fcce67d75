"""``Episode.env()``: the environment a harness subprocess runs an episode with. A child process that knows only
its environment makes an OpenAI Responses call and an Anthropic Messages call on the episode; Codex's
``config.toml`` names the provider ``agentjet`` on the Responses API; the Codex home goes with the episode."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tomllib
from pathlib import Path

from agentjet import SwarmClient
from agentjet.client.harness import CLAUDE_MODEL_VARS

CHILD = """
import anthropic, openai
oa = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL, OPENAI_API_KEY
print(oa.responses.create(model="tiny", input="hi").output_text)
an = anthropic.Anthropic(max_retries=0)  # ANTHROPIC_BASE_URL, ANTHROPIC_AUTH_TOKEN
import os
print(an.messages.create(model=os.environ["ANTHROPIC_MODEL"], max_tokens=20,
                         messages=[{"role": "user", "content": "hi"}]).content[0].text)
"""


def test_a_subprocess_with_the_episodes_environment_calls_the_episode(make_server) -> None:
    srv = make_server(reply="hello from the server")

    async def main() -> tuple[dict[str, str], Path, str, int, bool]:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            env = ep.env(agent="coder", base={"PATH": "/usr/bin:/bin", "ANTHROPIC_API_KEY": "sk-ant-real"})
            home = Path(env["CODEX_HOME"])
            done = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", CHILD], env=env,
                                           capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-2000:]
            calls = len(srv.server.registry.get(ep.episode_id).calls)
            config = (home / "config.toml").read_text()
            ep.reward(1.0)
        return env, home, done.stdout + config, calls, home.exists()

    env, home, out, calls, kept = asyncio.run(main())
    assert out.count("hello from the server") == 2 and calls == 2
    assert env["OPENAI_BASE_URL"].endswith("/v1") and env["ANTHROPIC_BASE_URL"] == env["OPENAI_BASE_URL"][:-3]
    assert env["OPENAI_API_KEY"] == env["ANTHROPIC_AUTH_TOKEN"] and env["OPENAI_API_KEY"].startswith("aj-ep-")
    assert "ANTHROPIC_API_KEY" not in env and env["PATH"] == "/usr/bin:/bin"  # a real key would be sent instead
    assert {env[v] for v in CLAUDE_MODEL_VARS} == {"tiny"}
    assert env["ANTHROPIC_CUSTOM_HEADERS"] == "X-Agent-Name: coder"
    assert not kept, "the Codex home is removed with the episode"
    config = tomllib.loads(out[out.index("model ="):])
    assert config["model"] == "tiny" and config["model_provider"] == "agentjet"
    provider = config["model_providers"]["agentjet"]
    assert provider["wire_api"] == "responses" and provider["base_url"] == env["OPENAI_BASE_URL"]
    assert provider["env_key"] == "OPENAI_API_KEY" and provider["http_headers"] == {"X-Agent-Name": "coder"}


def test_the_begin_response_names_the_anthropic_base_url_and_the_model(make_server) -> None:
    srv = make_server()

    async def main() -> tuple[str, str, str]:
        async with SwarmClient(srv.url) as c, c.episode(task_id="t") as ep:
            ep.reward(0.0)
            return ep.info.anthropic_base_url, ep.base_url, ep.model

    anthropic_url, base, model = asyncio.run(main())
    assert base == f"{srv.url}/v1" and anthropic_url == srv.url and model == "tiny"
