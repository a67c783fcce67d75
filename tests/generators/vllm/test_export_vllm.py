"""``ajet export`` served by vLLM: a SmolLM2 run trained one step, exported, and started with vLLM's own OpenAI
server on the exported directory (as ``vllm serve OUT`` would) gives the server's greedy ids at that version.

Opt-in with the other real-vLLM tests: ``make test-vllm`` (``-m vllm``); skipped when .venv-vllm is absent.
One vLLM start (~25-50 s on the 2-core CPU): run it under the shared lock."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from tests.test_export import export, server_greedy, train_one_step

from agentjet.runtime.launch import free_port

ROOT = Path(__file__).resolve().parents[3]
VLLM_PYTHON = Path(os.environ.get("AGENTJET_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"no vLLM venv at {VLLM_PYTHON} (make setup-vllm)"),
]


def vllm_greedy(model_dir: Path, prompt: list[int], max_tokens: int, log: Path) -> tuple[list[int], list[float]]:
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen([str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model",
                                 str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                                 "--max-model-len", "1024", "--enforce-eager", "--served-model-name", "exported"],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 600
            while True:
                assert proc.poll() is None, log.read_text()[-4000:]
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "vLLM did not start"
                time.sleep(1)
            body = {"model": "exported", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                    "logprobs": 1, "return_token_ids": True}
            choice = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=300).json()["choices"][0]
            return [int(t) for t in choice["token_ids"]], [float(x) for x in choice["logprobs"]["token_logprobs"]]
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def test_exported_run_serves_on_vllm_with_the_same_greedy_ids(make_server, tmp_path: Path) -> None:
    from agentjet.layouts import embedded_engine
    from agentjet.settings import GeneratorSettings, LearnerSettings

    engine = embedded_engine("smollm2-135m-instruct", GeneratorSettings(max_batch_size=4),
                             LearnerSettings(learning_rate=1e-4))
    srv = make_server(engine, training={"checkpoint_every": 1}, learner={"learning_rate": 1e-4})
    train_one_step(srv)
    prompt, served, logprobs = server_greedy(srv)
    out = tmp_path / "exported"
    export(srv.server.config.data_dir, out, "--step", "1")
    ids, lps = vllm_greedy(out, prompt, len(served), tmp_path / "vllm.log")
    n = min(len(ids), len(served))
    assert n >= 8 and ids[:n] == served[:n]  # vLLM may stop at its EOS where the engine's rule differs
    assert sum(abs(a - b) for a, b in zip(lps[:n], logprobs[:n], strict=True)) / n < 1e-2  # fp32 both
