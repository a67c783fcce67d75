"""A live server with the Tinker API on the tiny model (real LoRA adapters on one base), and the official SDK."""

from __future__ import annotations

from pathlib import Path

import pytest

KEY = "tml-test-key-0123456789"


@pytest.fixture
def tinker_server(make_server, tiny_model_path: Path):
    from agentjet.layouts.adapters import adapter_engines
    from agentjet.settings import GeneratorSettings, LearnerSettings

    def make(*, adapters: bool = True, key: str | None = KEY, **kw):
        if adapters:
            learner = {"lora": {"rank": 4, "adapters": ["swarm"]}}
            engine = adapter_engines(tiny_model_path, ["swarm"], GeneratorSettings(max_batch_size=8),
                                     LearnerSettings(learning_rate=1e-3, **learner))
            return make_server(engine, learner=learner, tinker_key=key, **kw)
        return make_server("tiny", tinker_key=key, **kw)

    return make


@pytest.fixture
def service_client(tinker_server):
    import tinker

    def make(srv=None, key: str = KEY, **kw):
        srv = srv or tinker_server(**kw)
        client = tinker.ServiceClient(base_url=srv.url, api_key=key)
        return client

    return make
