"""Thinking Machines' tinker-cookbook 0.5.8, unchanged, against a live server (opt-in: `make test-cookbook`, which
makes .venv-cookbook with `scripts/setup_cookbook.sh`). Its recipes run in their own venv, as a new user would run
them, with only their own options, offline (no hub: the tokenizer is the directory the server loaded, which
get_info names; math_rl's arithmetic problems are generated; chat_sl reads the cookbook's own example file):

- `math_rl env=arithmetic` for 3 steps (on the tiny model every group has a constant reward: the batches without a
  gradient that crashed it, issue 50);
- `chat_sl` for 2 steps, then `tinker_cookbook.weights.download` of its final state, loaded in PEFT: its logprobs
  equal a training client's made from the same state."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tests.tinker_api.conftest import KEY

pytestmark = [pytest.mark.cookbook, pytest.mark.server]
tinker = pytest.importorskip("tinker")

ROOT = Path(__file__).resolve().parents[2]
RENDERER = "qwen3_instruct"  # ChatML, as the tiny model's template (and SmolLM2's): docs/tinker.md


@pytest.fixture
def cookbook_python() -> Path:
    python = Path(os.environ.get("AGENTJET_COOKBOOK_PYTHON", ROOT / ".venv-cookbook" / "bin" / "python"))
    if not python.exists():
        pytest.skip(f"no {python}: make setup-cookbook")
    return python


def run(python: Path, args: list[str], url: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "TINKER_API_KEY": KEY, "TINKER_BASE_URL": url, "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled"}
    done = subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (args[:2], done.stdout[-3000:], done.stderr[-6000:])
    return done


def metrics(log_path: Path) -> list[dict]:
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_math_rl_arithmetic_runs_three_steps(tinker_server, cookbook_python: Path, tiny_model_path: Path,
                                             tmp_path: Path) -> None:
    srv = tinker_server()
    log = tmp_path / "math_rl"
    run(cookbook_python, ["-m", "tinker_cookbook.recipes.math_rl.train", "env=arithmetic",
                          f"model_name={tiny_model_path}", f"renderer_name={RENDERER}", "lora_rank=8",
                          "group_size=4", "groups_per_batch=4", "max_steps=3", f"base_url={srv.url}",
                          f"log_path={log}", "behavior_if_log_dir_exists=delete"], srv.url, tmp_path)
    rows = metrics(log)
    assert [r["progress/batch"] for r in rows] == [0, 1, 2]
    assert all("env/all/reward/total" in r for r in rows)
    final = [json.loads(x) for x in (log / "checkpoints.jsonl").read_text().splitlines()][-1]
    assert final["state_path"].startswith("tinker://") and final["name"] == "final"
    run_id = final["state_path"].removeprefix("tinker://").split("/")[0]
    info = srv.server.tinker.training_run(run_id)
    assert info["user_metadata"]["renderer_name"] == RENDERER and info["last_checkpoint"]["checkpoint_id"] == "weights/final"


def test_chat_sl_runs_two_steps_and_its_weights_download_and_load_in_peft(tinker_server, service_client,
                                                                           cookbook_python: Path,
                                                                           tiny_model_path: Path,
                                                                           tmp_path: Path) -> None:
    import torch
    from peft import PeftModel
    from tinker import types
    from transformers import AutoModelForCausalLM

    srv = tinker_server()
    log = tmp_path / "chat_sl"
    data = subprocess.run([str(cookbook_python), "-c", "import tinker_cookbook, os; print(os.path.join("
                           "os.path.dirname(tinker_cookbook.__file__), 'example_data', 'conversations.jsonl'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    run(cookbook_python, ["-m", "tinker_cookbook.recipes.chat_sl.train", f"dataset={data}",
                          f"model_name={tiny_model_path}", f"renderer_name={RENDERER}", "lora_rank=8",
                          "batch_size=8", "max_steps=2", "max_length=512", f"base_url={srv.url}", f"log_path={log}",
                          "behavior_if_log_dir_exists=delete"], srv.url, tmp_path)
    rows = metrics(log)
    assert [r["step"] for r in rows] == [0, 1] and all(np.isfinite(r["train_mean_nll"]) for r in rows)
    state = [json.loads(x) for x in (log / "checkpoints.jsonl").read_text().splitlines()][-1]["state_path"]
    # the renderer the recipe stored on its run, read back as a resume would
    client = service_client(srv)
    run_info = client.create_rest_client().get_training_run_by_tinker_path(state).result()
    assert (run_info.user_metadata or {}).get("renderer_name") == RENDERER
    adapter = tmp_path / "adapter"
    run(cookbook_python, ["-c", "import sys; from tinker_cookbook import weights; "
                                "weights.download(tinker_path=sys.argv[1], output_dir=sys.argv[2], base_url=sys.argv[3])",
                          state, str(adapter), srv.url], srv.url, tmp_path)
    assert {p.name for p in adapter.iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}
    tokens = [1, 40, 41, 42, 43, 44, 2]
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32),
                                     str(adapter)).eval()
    with torch.no_grad():
        logits = peft(torch.tensor([tokens[:-1]])).logits[0].float()
    theirs = torch.log_softmax(logits, -1)[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])].numpy()
    tc = client.create_training_client_from_state(state).result()
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    ours = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    assert np.allclose(theirs, ours, atol=1e-4)
    # the download's temporary export is deleted by the cookbook; nothing is left but the state
    assert not any(srv.server.tinker.checkpoints.data_dir.glob("*/external_weights/download"))
