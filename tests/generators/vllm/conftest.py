"""Fixtures: engines on the fake vLLM (``fake.py``), stopped at teardown."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.generators.vllm.fake import build_fake_engine


@pytest.fixture(scope="module")
def shared_vllm_engine(tmp_path_factory, tiny_model_path: Path):
    """One engine on the fake vLLM for the tests that change nothing (one start instead of several)."""
    from agentjet.runtime.blocking import run_blocking

    engine = build_fake_engine(tmp_path_factory.mktemp("vllm-shared"), tiny_model_path)
    yield engine
    run_blocking(engine.close())


@pytest.fixture
def make_vllm_engine(tmp_path: Path, tiny_model_path: Path):
    """Build VLLMEngines on the tiny model, served by the fake vLLM subprocess; all stopped at teardown."""
    from agentjet.runtime.blocking import run_blocking

    made = []

    def make(lora=None, lr: float = 1e-3, train_procs: int = 0, **settings):
        engine = build_fake_engine(tmp_path / f"vllm{len(made)}", tiny_model_path, lora, lr, train_procs, **settings)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        run_blocking(engine.close())
