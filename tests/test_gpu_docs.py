"""The commands in docs/gpu.md stay valid: each ``ajet`` line goes through the real flag parser, and each
``ajet server`` line through the settings loader, with the GPU placement checked (vLLM's GPUs and the trainer
ranks' GPUs disjoint, one GPU per rank, all on the node)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
import typer

from agentjet import layouts
from agentjet.cli import app
from agentjet.cli.server import cli_values, refuse_moved_flags
from agentjet.settings import EngineKind, ServerConfig, load_server_config

DOC = Path(__file__).resolve().parents[1] / "docs" / "gpu.md"
NODE_GPUS = set(range(8))


def doc_commands() -> list[list[str]]:
    """Every ``ajet ...`` command in the doc's bash blocks (continuation lines joined, comments dropped)."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.DOTALL)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.replace("$(which python)", sys.executable), comments=True)
            while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):  # VAR=value before the command
                words.pop(0)
            if words and words[0] == "ajet":
                commands.append(words[1:])
    return commands


COMMANDS = doc_commands()
SERVERS = [c[1:] for c in COMMANDS if c[0] == "server"]


def _id(args: list[str]) -> str:
    flags = [a for a in args if a in ("--engine", "--train-procs", "--lora-rank")]
    return "-".join([args[args.index("--model") + 1].split("/")[-1], *flags]) if "--model" in args else "server"


def _vllm_with_group(args: list[str]) -> bool:
    return "--train-procs" in args and "--engine" in args and args[args.index("--engine") + 1] == "vllm"


def test_the_doc_has_the_layouts() -> None:
    assert len(SERVERS) >= 4
    assert any(_vllm_with_group(a) for a in SERVERS), "the 8-GPU vLLM + trainer-group command"
    assert any("--train-procs" in a and "--engine" not in a for a in SERVERS), "the embedded engine + group"
    assert any("--train-procs" not in a for a in SERVERS), "one GPU"
    text = DOC.read_text()
    # what was measured names the card it ran on, and what was not says so
    assert "Measured on one H100" in text and "has not been measured on a GPU" in text


@pytest.mark.parametrize("words", COMMANDS, ids=lambda w: w[0])
def test_every_command_parses(words: list[str]) -> None:
    command = typer.main.get_command(app).commands[words[0]]  # type: ignore[attr-defined]
    command.make_context(words[0], list(words[1:]))  # unknown flags and bad values raise here


@pytest.mark.parametrize("args", SERVERS, ids=[_id(a) for a in SERVERS])
def test_every_server_command_validates(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "swarm.token").write_text("swarm-s3cret\n")
    (tmp_path / "admin.token").write_text("admin-s3cret\n")
    command = typer.main.get_command(app).commands["server"]  # type: ignore[attr-defined]
    params = command.make_context("server", list(args)).params
    refuse_moved_flags(params)  # no flag renamed for its role (--train-devices is --learner-devices)
    config = load_server_config(cli_values(params), None, {})
    check_placement(config)


def check_placement(config: ServerConfig) -> None:
    if config.host != "127.0.0.1":
        assert config.swarm_token and config.admin_token, "a public bind needs both tokens"
    group, gen = config.learner.group, config.generator
    train = {int(g) for g in (group.cuda_visible_devices or "").split(",") if g}
    if group.procs:
        assert len(train) == group.procs and train <= NODE_GPUS
    layouts.check_placement(config, gpu_count=len(NODE_GPUS), environ={})  # what the server checks at start
    if gen.kind is EngineKind.VLLM:
        assert gen.vllm.platform == "gpu"
        vllm = {int(g) for g in (gen.vllm.cuda_visible_devices or "").split(",") if g}
        if "--tensor-parallel-size" in gen.vllm.extra_args:
            tp = int(gen.vllm.extra_args[gen.vllm.extra_args.index("--tensor-parallel-size") + 1])
            assert tp == len(vllm), "tensor parallel size = vLLM's GPUs"
    elif group.procs:
        device = config.placement.device
        assert device.startswith("cuda:") and int(device.split(":")[1]) not in train, "rollouts on their own GPU"
