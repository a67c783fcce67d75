"""`ajet server --train-procs`: settings errors are refused with a message before any rank starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentjet.cli import app


def run(tiny_model_path: Path, tmp_path: Path, *extra: str):
    return CliRunner().invoke(app, terminal_width=200, args=["server", "--model", str(tiny_model_path), "--data-dir", str(tmp_path), *extra])


def test_a_trainer_group_cannot_train_lora(tiny_model_path: Path, tmp_path: Path) -> None:
    result = run(tiny_model_path, tmp_path, "--train-procs", "2", "--lora-rank", "4")
    assert result.exit_code == 2 and "cannot train LoRA adapters" in " ".join(result.output.split())


def test_vllm_and_a_trainer_group_on_the_same_gpu_are_refused_naming_both(tiny_model_path: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agentjet.server.http.app.serve", lambda config: pytest.fail("the server must not start"))
    vllm = tmp_path / "python"
    vllm.touch()  # a vLLM interpreter that exists (the check comes before anything is started)
    result = run(tiny_model_path, tmp_path, "--engine", "vllm", "--vllm-python", str(vllm), "--vllm-platform", "gpu",
                 "--vllm-cuda-visible-devices", "0,1", "--train-procs", "2", "--learner-device", "cuda",
                 "--learner-devices", "1,2")
    text = " ".join(result.output.split())
    assert result.exit_code != 0 and "overlap on [1]" in text and "--colocate" in text


@pytest.mark.parametrize(("extra", "message"), [
    (["--train-procs", "2", "--learner-nnodes", "2"], "rdzv_endpoint, control_port, auth_token"),
    (["--train-procs", "-1"], "procs"),
    (["--learner-procs", "2", "--learner-control-port", "port"],
     "learner.group.control_port (--learner-control-port)"),
    (["--train-procs", "4", "--learner-devices", "0,1"], "fewer GPUs"),
    (["--train-procs", "2", "--rdzv-endpoint", "node0"], "rdzv_endpoint must be host:port"),
])
def test_bad_trainer_group_settings_are_refused(tiny_model_path: Path, tmp_path: Path, monkeypatch,
                                                extra: list[str], message: str) -> None:
    monkeypatch.delenv("AGENTJET_LEARNER__GROUP__AUTH_TOKEN", raising=False)
    monkeypatch.delenv("AGENTJET_LEARNER__GROUP__AUTH_TOKEN_FILE", raising=False)
    result = run(tiny_model_path, tmp_path, *extra)
    assert result.exit_code == 2
    assert "invalid settings" in result.output and message in " ".join(result.output.split())


@pytest.mark.parametrize(("extra", "message"), [
    (["--train-nnodes", "2"], "--train-nnodes moved to --learner-nnodes"),
    (["--train-devices", "0,1"], "--train-devices moved to --learner-devices"),
    (["--no-train-mixed-precision"], "--train-mixed-precision moved to --learner-mixed-precision"),
])
def test_a_group_flag_renamed_for_its_role_names_the_new_one(tiny_model_path: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            extra: list[str], message: str) -> None:
    monkeypatch.setattr("agentjet.server.http.app.serve", lambda config: pytest.fail("the server must not start"))
    result = run(tiny_model_path, tmp_path, "--train-procs", "1", *extra)
    assert result.exit_code == 2 and message in " ".join(result.output.split())
