from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def fake_settings(**overrides):
    """Settings that run tests/engines/fake_vllm.py in place of vLLM (same routes and JSON shapes)."""
    from agentjet.engines.vllm import VLLMSettings

    base = {"python": Path(sys.executable), "module": "fake_vllm", "extra_env": {"PYTHONPATH": str(HERE)},
            "dtype": "float32", "max_model_len": 1024, "startup_timeout_s": 120, "restart_backoff_s": 0.1,
            "watch_interval_s": 0.1, "stop_timeout_s": 10, "sync_timeout_s": 60, "probe_threshold": 0.01}
    return VLLMSettings(**{**base, **overrides})


@pytest.fixture
def make_vllm_engine(tmp_path: Path, tiny_model_path: Path):
    """Build VLLMEngines on the tiny model, served by the fake vLLM subprocess; all stopped at teardown."""
    from agentjet.engines.base import TrainConfig
    from agentjet.engines.vllm import VLLMEngine

    made = []

    def make(lora=None, lr: float = 1e-3, **settings):
        engine = VLLMEngine(tiny_model_path, settings=fake_settings(**settings), work_dir=tmp_path / f"vllm{len(made)}",
                            train_config=TrainConfig(learning_rate=lr), lora=lora)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close_sync()
