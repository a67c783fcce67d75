from __future__ import annotations

import os
from pathlib import Path

import pytest

SERVER_FIXTURES = {"make_server", "fuzz_server_factory", "api", "control_api", "engine_api"}
TINY_FIXTURES = {"tiny_model_path", "tiny_engine"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Levels, by what a test needs: ``server`` (a real HTTP server), ``tiny`` (the tiny model, no server), or
    neither (pure logic). ``-m "not server"`` runs the fast levels only. Tests marked ``cuda`` are skipped
    without a CUDA device."""
    cuda = _has_cuda() if any(item.get_closest_marker("cuda") for item in items) else False
    for item in items:
        if item.get_closest_marker("cuda") is not None and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        names = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("server") is not None:
            continue
        if names & SERVER_FIXTURES:
            item.add_marker(pytest.mark.server)
        elif names & TINY_FIXTURES:
            item.add_marker(pytest.mark.tiny)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


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
    from agentjet.settings import EngineSettings

    engine = HFEngine(tiny_model_path, EngineSettings(max_batch_size=8))
    yield engine
    engine.shutdown()


@pytest.fixture
def chat_ids(tiny_model_path: Path):
    def make(text: str, engine) -> list[int]:
        return list(engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False))

    return make


@pytest.fixture
def make_server(tmp_path: Path, tiny_model_path: Path):
    """Start real swarm servers (uvicorn on a free loopback port). ``engine``: "tiny", "null" or an Engine."""
    from agentjet.engines.hf import HFEngine
    from agentjet.engines.null import NullEngine
    from agentjet.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.app import BackgroundServer
    from agentjet.settings import EngineSettings, ServerConfig, TrainingSettings

    started: list[BackgroundServer] = []

    def make(engine="null", data_dir: Path | None = None, resume: bool = False, reply: str = "ok",
             training: dict | None = None, clock=None, **config):
        if engine == "tiny":
            engine = HFEngine(tiny_model_path, EngineSettings(max_batch_size=8))
        elif engine == "null":
            from transformers import AutoTokenizer

            engine = NullEngine(AutoTokenizer.from_pretrained(tiny_model_path), reply=reply)
        training = {"group_size": 2, "batch_groups": 1, "learning_rate": 1e-3, "checkpoint_every": 0,
                    **(training or {})}
        cfg = ServerConfig(model=str(tiny_model_path), served_model_name="tiny", port=free_port(),
                           data_dir=data_dir or tmp_path / f"server{len(started)}",
                           training=TrainingSettings(**training), resume=resume, **config)
        bg = BackgroundServer(SwarmServer(cfg, engine, clock)).start()
        started.append(bg)
        return bg

    yield make
    for bg in started:
        if bg._thread.is_alive():
            bg.stop()


def settle(srv) -> None:
    """Until the server's train loop has made a whole pass over what it holds now (``Trainer.settled``): after
    this, a step that did not happen will not happen by itself. The event-based way to show that nothing trained."""
    srv.call(srv.server.trainer.settled())


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(interval)
