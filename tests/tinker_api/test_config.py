"""A Tinker key with a LoRA rank and no adapters: the swarm's policy is served as the one adapter ``policy`` (so that
Tinker training clients can be adapters beside it). No validator writes that into the settings: they keep what was
given, and the layout and the server compute it (``ServerConfig.swarm_adapters``, ``default_adapter``), whichever
entrance the settings came through."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.tinker_api.conftest import KEY
from typer.testing import CliRunner

from agentjet.settings import ServerConfig, SettingsError, load_server_config, validate, write_config_file

RANK = {"learner": {"lora": {"rank": 4}}}


@pytest.mark.parametrize(("given", "adapters", "default"), [
    ({"tinker_key": KEY, **RANK}, ["policy"], "policy"),
    ({"tinker_key": KEY, "learner": {"lora": {"rank": 4, "adapters": ["planner", "coder"], "default_adapter": "coder"}}},
     ["planner", "coder"], "coder"),  # named adapters are the swarm's
    ({"tinker_key": KEY}, [], None),  # full fine-tuning: one policy, no adapters
    (RANK, [], None),  # no Tinker key: one LoRA policy
    ({"tinker_key": KEY, **RANK, "generator": {"kind": "vllm"}}, [], None),  # the embedded generator only
    ({"tinker_key": KEY, **RANK, "generator": {"kind": "null"}}, [], None),
])
def test_the_swarm_adapters_are_computed_from_the_settings_not_written_into_them(
        given: dict[str, Any], adapters: list[str], default: str | None) -> None:
    cfg = validate(given)
    assert cfg.swarm_adapters() == adapters and cfg.default_adapter() == default
    lora = given.get("learner", {}).get("lora", {})
    assert cfg.learner.lora.adapters == lora.get("adapters", [])  # the settings hold what was given
    assert cfg.learner.lora.default_adapter == lora.get("default_adapter")
    assert cfg.public_dict()["learner"]["lora"]["adapters"] == lora.get("adapters", [])


def _cli_config(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> ServerConfig:
    from agentjet.cli import app

    configs: list[ServerConfig] = []
    monkeypatch.setattr("agentjet.server.http.app.serve", lambda config: configs.append(config))
    for name in list(__import__("os").environ):
        if name.startswith("AGENTJET_") and name != "AGENTJET_HOME":
            monkeypatch.delenv(name)
    result = CliRunner().invoke(app, ["server", *args])
    assert result.exit_code == 0, result.output
    return configs[-1]


def test_every_entrance_gets_the_policy_adapter(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from agentjet.apps.up import server_spec

    (tmp_path / "server.yaml").write_text(yaml.safe_dump({"tinker_key": KEY, **RANK}))
    configs = {
        "cli": _cli_config(monkeypatch, ["--tinker-key", KEY, "--lora-rank", "4"]),
        "environment": load_server_config(environ={"AGENTJET_TINKER_KEY": KEY, "AGENTJET_LEARNER__LORA__RANK": "4"}),
        "config file": load_server_config(config_file=tmp_path / "server.yaml"),
        "ajet up": server_spec("a", {"port": 1234, "options": {"tinker-key": KEY, "lora-rank": 4}}, tmp_path).config,
    }
    child = write_config_file(configs["ajet up"], tmp_path / "child.yaml")  # what `ajet up` hands its child
    configs["child of ajet up"] = load_server_config(config_file=child)
    for entrance, cfg in configs.items():
        assert (cfg.swarm_adapters(), cfg.default_adapter()) == (["policy"], "policy"), entrance
        assert cfg.learner.lora.adapters == [] and cfg.learner.lora.default_adapter is None, entrance


def test_cocktail_quotas_beside_the_policy_adapter_are_refused_at_start_as_on_a_live_change() -> None:
    """Quotas with several adapters are not built: refused when the settings are read, as a live change of a running
    server's settings is (the rule reads the computed adapters, so the two agree)."""
    with pytest.raises(SettingsError, match="task_ratios"):
        validate({"tinker_key": KEY, **RANK, "training": {"task_ratios": {"math": 1.0}}})
    assert validate({**RANK, "training": {"task_ratios": {"math": 1.0}}}).training.task_ratios == {"math": 1.0}


@pytest.mark.server
def test_a_server_started_with_a_tinker_key_and_a_rank_serves_every_agent_from_the_policy_adapter(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model_path: Path) -> None:
    from agentjet import SwarmClient
    from agentjet.layouts import build_from_settings
    from agentjet.runtime.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.http.app import BackgroundServer

    cfg = _cli_config(monkeypatch, ["--model", str(tiny_model_path), "--served-model-name", "tiny", "--device", "cpu",
                                    "--tinker-key", KEY, "--lora-rank", "4", "--port", str(free_port()),
                                    "--data-dir", str(tmp_path / "d")])
    assert cfg.learner.lora.adapters == []
    with BackgroundServer(SwarmServer(cfg, build_from_settings(cfg))) as srv:
        assert srv.server.adapters is not None and srv.server.adapters.names() == ["policy"]

        async def main() -> None:
            async with SwarmClient(srv.url) as client, client.episode(task_id="t") as ep:
                reply = await ep.openai(agent="anyone").chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
                assert reply.choices[0].message is not None
                ep.reward(1.0)

        asyncio.run(main())
        status = srv.server.status()
        assert set(status.adapters) == {"policy"} and status.adapters["policy"].pending_episodes == 1
