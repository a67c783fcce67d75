"""The fake vLLM (``fake_vllm.py``, run as a subprocess in place of vLLM: same routes and JSON shapes) as settings and
server configs, for the tests of the vLLM generator, the layouts on it and the fleet of vLLM replicas."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def fake_settings(**overrides):
    """Settings that run tests/generators/vllm/fake_vllm.py in place of vLLM (same routes and JSON shapes)."""
    from agentjet.generators.vllm import VLLMSettings

    base = {"python": Path(sys.executable), "module": "fake_vllm", "extra_env": {"PYTHONPATH": str(HERE)},
            "dtype": "float32", "max_model_len": 1024, "startup_timeout_s": 120, "restart_backoff_s": 0.1,
            "watch_interval_s": 0.1, "stop_timeout_s": 10, "sync_timeout_s": 60, "probe_threshold": 0.01}
    return VLLMSettings(**{**base, **overrides})


def fake_config(model: Path, lora=None, lr: float = 1e-3, train_procs: int = 0, **settings):
    """A server config with vLLM (the fake) as the generator; the in-process learner, or a trainer group."""
    from agentjet.settings import (
        GeneratorSettings,
        LearnerGroupSettings,
        LearnerSettings,
        LoraSettings,
        ServerConfig,
    )

    group = LearnerGroupSettings(procs=train_procs, startup_timeout_s=120, step_timeout_s=120, push_timeout_s=60,
                                 collective_timeout_s=60)
    return ServerConfig(model=str(model), generator=GeneratorSettings(kind="vllm", vllm=fake_settings(**settings)),
                        learner=LearnerSettings(learning_rate=lr, lora=lora or LoraSettings(), group=group))


def build_fake_engine(work_dir: Path, model: Path, lora=None, lr: float = 1e-3, train_procs: int = 0, **settings):
    from agentjet.layouts import vllm_engine

    config = fake_config(model, lora, lr, train_procs, **settings).model_copy(update={"data_dir": work_dir})
    return vllm_engine(config, work_dir)
