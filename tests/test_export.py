"""``ajet export``: a trained run's checkpoint becomes a standalone Hugging Face model directory whose greedy
tokens, loaded with transformers alone, are the server's at that version (full weights and merged LoRA); the
adapter alone with ``--adapter-only``; a model card; ``--push-to-hub`` through a faked hub client."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import wait_until
from typer.testing import CliRunner

from agentjet import SwarmClient
from agentjet.cli import app
from agentjet.engines.base import SamplingParams

QUESTION = [{"role": "user", "content": "what is 2 + 3?"}]
NEW_TOKENS = 16


def train_one_step(srv: Any) -> None:
    """One GRPO group of two episodes with different rewards (one train step, one checkpoint), then an eval
    episode at the new version (its reward goes in the model card)."""

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            for reward in (0.0, 1.0):
                async with client.episode(task_id="sum") as ep:
                    await ep.openai().chat.completions.create(model="x", messages=QUESTION, max_tokens=8)
                    ep.reward(reward)
            wait_until(lambda: srv.server.counters.training.train_steps == 1, timeout=120)
            async with client.episode(task_id="sum", eval=True) as ep:
                await ep.openai().chat.completions.create(model="x", messages=QUESTION, max_tokens=8, temperature=0)
                ep.reward(0.25)

    asyncio.run(main())
    wait_until(lambda: (srv.server.config.data_dir / "checkpoints" / "step-000001").is_dir(), timeout=60)


def server_greedy(srv: Any) -> tuple[list[int], list[int], list[float]]:
    """The prompt ids, and the greedy reply ids and their logprobs from the server's engine (at its version)."""
    prompt = srv.server.formatter.prompt_ids(QUESTION, None)
    result = srv.call(srv.server.engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)))
    return prompt, list(result.token_ids), list(result.logprobs)


def transformers_greedy(model_dir: Path, prompt: list[int], adapter: bool = False) -> tuple[list[int], list[float]]:
    """Greedy ids from the exported directory with transformers alone, and their logprobs (a tiny random model's
    greedy reply repeats one token; the logprobs tell weights apart far more finely)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    assert tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True, return_dict=False) == prompt
    if adapter:
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    ids = out[0, len(prompt):].tolist()
    with torch.no_grad():
        logits = model(out).logits[0, len(prompt) - 1: -1].float()
    return ids, torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()


def assert_same_reply(exported: tuple[list[int], list[float]], served: list[int], logprobs: list[float]) -> None:
    ids, lps = exported
    assert ids == served
    assert lps == pytest.approx(logprobs, abs=1e-4)


def export(run_dir: Path, out: Path, *extra: str) -> str:
    result = CliRunner().invoke(app, ["export", str(run_dir), str(out), *extra])
    assert result.exit_code == 0, result.output
    return result.output


def weights_differ(a: Path, b: Path) -> bool:
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return any(not (wa[k] == wb[k]).all() for k in wa if k in wb)


@pytest.mark.server
def test_export_round_trips_through_transformers(make_server, tiny_model_path: Path, tmp_path: Path) -> None:
    srv = make_server("tiny", training={"checkpoint_every": 1})
    train_one_step(srv)
    prompt, served, logprobs = server_greedy(srv)
    assert len(served) == NEW_TOKENS
    run_dir = srv.server.config.data_dir
    out = tmp_path / "exported"
    assert "step 1 (policy version 1)" in export(run_dir, out, "--step", "1")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= names
    assert not names & {"optimizer.pt", "agentjet_state.json", "trainer_state.json"}  # the run's own files stay
    assert weights_differ(out, tiny_model_path)  # the trained weights, not the base model's
    assert_same_reply(transformers_greedy(out, prompt), served, logprobs)
    assert transformers_greedy(tiny_model_path, prompt)[1] != pytest.approx(logprobs, abs=1e-4)  # base differs
    card = (out / "README.md").read_text()
    assert f"`{tiny_model_path}`" in card and "| step | 1 |" in card and "| policy version | 1 |" in card
    assert "0.2500 (mean of 1 eval episodes" in card and str(run_dir.resolve()) in card
    settings = json.loads(card.split("```json\n", 1)[1].split("\n```", 1)[0])
    assert settings["training"]["checkpoint_every"] == 1 and "admin_token" not in settings

    # the same checkpoint by policy version; a missing one names what is kept; an existing OUT is refused
    export(run_dir, tmp_path / "by-version", "--version", "1")
    assert (tmp_path / "by-version" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    missing = CliRunner().invoke(app, ["export", str(run_dir), str(tmp_path / "x"), "--step", "7"])
    assert missing.exit_code != 0 and "no checkpoint at step 7" in missing.output and "step 1 (version 1)" in missing.output
    again = CliRunner().invoke(app, ["export", str(run_dir), str(out)])
    assert again.exit_code != 0 and "not empty" in again.output
    adapter = CliRunner().invoke(app, ["export", str(run_dir), str(tmp_path / "a"), "--adapter-only"])
    assert adapter.exit_code != 0 and "trained without LoRA" in adapter.output


@pytest.mark.server
def test_lora_run_exports_merged_and_adapter_only(make_server, tiny_model_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("peft")
    from agentjet.layouts import embedded_engine
    from agentjet.settings import GeneratorSettings, LearnerSettings, LoraSettings

    learner = LearnerSettings(lora=LoraSettings(rank=4, alpha=8), learning_rate=1e-2)
    engine = embedded_engine(tiny_model_path, GeneratorSettings(max_batch_size=8), learner)
    srv = make_server(engine, training={"checkpoint_every": 1}, learner=learner.model_dump())
    train_one_step(srv)
    prompt, served, logprobs = server_greedy(srv)
    run_dir = srv.server.config.data_dir
    merged = tmp_path / "merged"
    export(run_dir, merged)
    assert not (merged / "adapter_config.json").exists() and weights_differ(merged, tiny_model_path)
    assert_same_reply(transformers_greedy(merged, prompt), served, logprobs)
    only = tmp_path / "adapter"
    export(run_dir, only, "--adapter-only")
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= {p.name for p in only.iterdir()}
    assert not (only / "model.safetensors").exists() and "library_name: peft" in (only / "README.md").read_text()
    assert_same_reply(transformers_greedy(only, prompt, adapter=True), served, logprobs)


@pytest.mark.server
def test_one_adapter_of_a_run_with_several_exports_merged_and_alone(make_server, tiny_model_path: Path,
                                                                   tmp_path: Path) -> None:
    from agentjet.layouts.adapters import adapter_engines
    from agentjet.settings import GeneratorSettings, LearnerSettings, LoraSettings

    roles = ["planner", "executor"]
    learner = LearnerSettings(lora=LoraSettings(rank=4, alpha=8, adapters=roles), learning_rate=1e-2)
    engine = adapter_engines(tiny_model_path, roles, GeneratorSettings(max_batch_size=8), learner)
    srv = make_server(engine, training={"checkpoint_every": 1}, learner=learner.model_dump())

    async def planner_group() -> None:
        async with SwarmClient(srv.url) as client:
            for reward in (0.0, 1.0):
                async with client.episode(task_id="sum") as ep:
                    await ep.openai(agent="planner").chat.completions.create(model="x", messages=QUESTION,
                                                                             max_tokens=8)
                    ep.reward(reward)

    asyncio.run(planner_group())
    wait_until(lambda: srv.server.status().adapters["planner"].train_steps == 1, timeout=120)
    prompt = srv.server.formatter.prompt_ids(QUESTION, None)
    planner = srv.call(engine.engine("planner").generate(prompt, SamplingParams(temperature=0.0,
                                                                                max_tokens=NEW_TOKENS)))
    run_dir = srv.server.config.data_dir
    srv.stop()  # checkpoints every adapter that stepped
    result = CliRunner().invoke(app, ["export", str(run_dir), str(tmp_path / "x")])
    assert result.exit_code != 0 and "--adapter NAME" in result.output and "planner" in result.output
    missing = CliRunner().invoke(app, ["export", str(run_dir), str(tmp_path / "y"), "--adapter", "critic"])
    assert missing.exit_code != 0 and "planner" in missing.output
    merged, only = tmp_path / "merged", tmp_path / "only"
    assert "adapter planner's step 1" in export(run_dir, merged, "--adapter", "planner")
    assert_same_reply(transformers_greedy(merged, prompt), list(planner.token_ids), list(planner.logprobs))
    export(run_dir, only, "--adapter", "planner", "--adapter-only")
    assert_same_reply(transformers_greedy(only, prompt, adapter=True), list(planner.token_ids),
                      list(planner.logprobs))
    assert "| adapter | `planner`" in (only / "README.md").read_text()


class FakeHfApi:
    """Records what ``ajet export --push-to-hub`` asks of the hub client; no network."""

    calls: list[tuple[str, dict[str, Any]]] = []

    def __init__(self, token: str | None = None) -> None:
        self.calls.append(("init", {"token": token}))

    def create_repo(self, repo_id: str, **kwargs: Any) -> None:
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))

    def upload_folder(self, **kwargs: Any) -> Any:
        self.calls.append(("upload_folder", {**kwargs, "files": sorted(p.name for p in
                                                                        Path(kwargs["folder_path"]).iterdir())}))
        return type("CommitInfo", (), {"commit_url": f"https://hub.example/{kwargs['repo_id']}/commit/1"})()


@pytest.mark.server
def test_push_to_hub_uploads_the_export(make_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        network_attempts: list[str]) -> None:
    import huggingface_hub

    srv = make_server("tiny", training={"checkpoint_every": 1})
    train_one_step(srv)
    run_dir = srv.server.config.data_dir
    offline = CliRunner().invoke(app, ["export", str(run_dir), str(tmp_path / "o"), "--push-to-hub", "me/m"])
    assert offline.exit_code != 0 and "HF_HUB_OFFLINE" in offline.output  # the tests run offline
    assert (tmp_path / "o" / "model.safetensors").exists()  # the export itself was kept
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_TOKEN", "hf_t0ken")
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHfApi)
    FakeHfApi.calls = []
    output = export(run_dir, tmp_path / "p", "--push-to-hub", "me/tiny-rl")
    assert "https://hub.example/me/tiny-rl/commit/1" in output
    (init, create, upload) = FakeHfApi.calls
    assert init == ("init", {"token": "hf_t0ken"})
    assert create[1]["repo_id"] == "me/tiny-rl" and create[1]["private"] is True and create[1]["exist_ok"] is True
    assert upload[1]["repo_id"] == "me/tiny-rl" and upload[1]["folder_path"] == str(tmp_path / "p")
    assert {"README.md", "model.safetensors", "config.json"} <= set(upload[1]["files"])
    assert network_attempts == []


@pytest.mark.server
def test_a_hub_model_run_names_its_base_on_the_card(offline: None, hub_cache: dict[str, Path], tmp_path: Path) -> None:
    """A run on a hub id: the card's ``base_model`` is the id at the snapshot's commit, and an adapter exported
    alone points at the hub id (not at this machine's cache path), so it loads anywhere."""
    pytest.importorskip("peft")
    from tests.conftest import SHA_V1

    from agentjet.layouts import build_engine
    from agentjet.runtime.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.http.app import BackgroundServer
    from agentjet.settings import (
        GeneratorSettings,
        LearnerSettings,
        LoraSettings,
        ServerConfig,
        TrainingSettings,
    )

    config = ServerConfig(model="acme/tiny-chat", model_revision="v1", port=free_port(), data_dir=tmp_path / "run",
                          generator=GeneratorSettings(max_batch_size=8),
                          learner=LearnerSettings(lora=LoraSettings(rank=4, alpha=8), learning_rate=1e-2),
                          training=TrainingSettings(group_size=2, batch_groups=1, checkpoint_every=1))
    with BackgroundServer(SwarmServer(config, build_engine(config))) as srv:
        train_one_step(srv)
    export(tmp_path / "run", tmp_path / "merged")
    card = (tmp_path / "merged" / "README.md").read_text()
    assert "base_model: acme/tiny-chat\n" in card and f"`acme/tiny-chat` (revision `{SHA_V1}`)" in card
    assert str(hub_cache["cache"]) not in card
    export(tmp_path / "run", tmp_path / "adapter", "--adapter-only")
    adapter = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "acme/tiny-chat" and adapter["revision"] == SHA_V1


@pytest.mark.server
def test_a_checkpoint_written_before_the_settings_moved_resumes_and_exports(make_server, tmp_path: Path) -> None:
    """A data dir whose checkpoint records the settings in their shape before the sections by role (``engine``,
    ``trainer``, ``training.learning_rate``; the fixture was dumped by that code) and whose learner state names
    them ``engine``: a server resumes from it, trains on, and ``ajet export`` writes its card."""
    data = tmp_path / "run"
    srv = make_server("tiny", data_dir=data, training={"checkpoint_every": 1})
    train_one_step(srv)
    srv.stop()
    before = json.loads((Path(__file__).parent / "fixtures" / "settings_before_roles.json").read_text())
    for ckpt in (data / "checkpoints").glob("step-*"):
        run = json.loads((ckpt / "agentjet_run.json").read_text())
        (ckpt / "agentjet_run.json").write_text(json.dumps({**run, "settings": before}))
        state_file = ckpt / "agentjet_state.json"
        state = json.loads(state_file.read_text())
        state["engine"] = before["engine"]  # the learner's state as the earlier code wrote it
        state.pop("learner", None)
        state_file.write_text(json.dumps(state))

    again = make_server("tiny", data_dir=data, resume=True, training={"checkpoint_every": 1})
    assert again.server.engine.policy_version == 1
    train_one_step_more(again)
    again.stop()
    out = tmp_path / "exported"
    assert "step 1 (policy version 1)" in export(data, out, "--step", "1")
    card = json.loads((out / "README.md").read_text().split("```json\n", 1)[1].split("\n```", 1)[0])
    assert card["engine"]["max_batch_size"] == 8 and card["training"]["learning_rate"] == 1e-3  # as recorded
    export(data, tmp_path / "latest")  # the step written after the resume, in the new shape
    latest = (tmp_path / "latest" / "README.md").read_text()
    assert '"learner": {' in latest and '"engine": {' not in latest


def train_one_step_more(srv: Any) -> None:
    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            for reward in (0.0, 1.0):
                async with client.episode(task_id="sum2") as ep:
                    await ep.openai().chat.completions.create(model="x", messages=QUESTION, max_tokens=8)
                    ep.reward(reward)
    asyncio.run(main())
    wait_until(lambda: srv.server.engine.policy_version == 2, timeout=120)
    wait_until(lambda: (srv.server.config.data_dir / "checkpoints" / "step-000002").is_dir(), timeout=60)
