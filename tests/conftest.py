from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def agentjet_home() -> Path:
    """The model cache the tests use: $AGENTJET_TEST_HOME if set, else the user's cache, so SmolLM2 is
    converted once per machine (~30 s). Cached builds carry a version and are rebuilt when stale."""
    from agentjet.models import agentjet_home as default_home

    home = Path(os.environ.get("AGENTJET_TEST_HOME") or default_home())
    os.environ["AGENTJET_HOME"] = str(home)
    return home


@pytest.fixture(scope="session")
def tiny_model_path(agentjet_home: Path) -> Path:
    from agentjet.models import resolve_model

    return resolve_model("tiny-random")


@pytest.fixture
def tiny_engine(tiny_model_path: Path):
    from agentjet.engines.hf import HFEngine

    engine = HFEngine(tiny_model_path, max_batch_size=8)
    yield engine
    engine._executor.shutdown(wait=False)


@pytest.fixture
def chat_ids(tiny_model_path: Path):
    def make(text: str, engine) -> list[int]:
        return list(engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False))

    return make
