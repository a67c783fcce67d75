"""`ajet server --engine vllm` wiring: settings land in the server config; a missing vLLM venv is a clear error."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from agentjet.cli import app


def test_missing_vllm_python_is_refused_before_anything_starts(tmp_path: Path, tiny_model_path: Path) -> None:
    missing = tmp_path / "no-venv" / "bin" / "python"
    result = CliRunner().invoke(app, ["server", "--engine", "vllm", "--model", str(tiny_model_path),
                                      "--vllm-python", str(missing), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2
    assert "--vllm-python" in result.output and "make setup-vllm" in result.output


def test_bad_vllm_setting_names_the_field(tmp_path: Path, tiny_model_path: Path) -> None:
    result = CliRunner().invoke(app, ["server", "--engine", "vllm", "--model", str(tiny_model_path),
                                      "--vllm-platform", "tpu", "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2
    assert "invalid settings" in result.output and "generator.vllm.platform (--vllm-platform)" in result.output


def test_server_config_carries_the_vllm_block() -> None:
    from agentjet.settings import GeneratorSettings, ServerConfig, VLLMSettings

    cfg = ServerConfig(generator=GeneratorSettings(kind="vllm", vllm=VLLMSettings(kv_cache_gib=4)))
    dumped = cfg.model_dump(mode="json")
    assert dumped["generator"]["vllm"]["kv_cache_gib"] == 4 and dumped["generator"]["kind"] == "vllm"
    assert ServerConfig.model_validate(dumped).generator.vllm == cfg.generator.vllm


def test_demo_takes_the_engine_and_refuses_one_that_cannot_learn(monkeypatch) -> None:
    seen = []
    monkeypatch.setattr("agentjet.apps.demo.run_demo", lambda s, console: seen.append(s) or _Result())
    assert CliRunner().invoke(app, ["demo", "--engine", "vllm"]).exit_code == 0
    assert seen[-1].engine == "vllm"
    result = CliRunner().invoke(app, ["demo", "--engine", "null"])
    assert result.exit_code != 0 and "--engine null cannot learn" in result.output and len(seen) == 1


class _Result:
    eval_before = 0.1
    eval_after = 0.2
