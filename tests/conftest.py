from __future__ import annotations

import hashlib
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

# No test downloads: huggingface_hub and transformers stay off the network (read at their import, so set here,
# before any test imports them). The hub tests also guard sockets (``network_attempts``).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

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
    from agentjet.layouts import embedded_engine
    from agentjet.runtime.blocking import run_blocking
    from agentjet.settings import GeneratorSettings

    engine = embedded_engine(tiny_model_path, GeneratorSettings(max_batch_size=8))
    yield engine
    run_blocking(engine.close())


@pytest.fixture
def chat_ids(tiny_model_path: Path):
    def make(text: str, engine) -> list[int]:
        return list(engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False))

    return make


@pytest.fixture
def make_server(tmp_path: Path, tiny_model_path: Path):
    """Start real swarm servers (uvicorn on a free loopback port). ``engine``: "tiny", "null" or a ComposedEngine."""
    from agentjet.layouts import embedded_engine
    from agentjet.layouts.null import null_engine
    from agentjet.runtime.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.http.app import BackgroundServer
    from agentjet.settings import GeneratorSettings, LearnerSettings, ServerConfig, TrainingSettings

    started: list[BackgroundServer] = []

    def make(engine="null", data_dir: Path | None = None, resume: bool = False, reply: str = "ok",
             training: dict | None = None, learner: dict | None = None, clock=None, **config):
        if engine == "tiny":
            engine = embedded_engine(tiny_model_path, GeneratorSettings(max_batch_size=8))
        elif engine == "null":
            from transformers import AutoTokenizer

            engine = null_engine(AutoTokenizer.from_pretrained(tiny_model_path), reply=reply)
        training = {"group_size": 2, "batch_groups": 1, "checkpoint_every": 0,
                    **(training or {})}
        cfg = ServerConfig(model=str(tiny_model_path), served_model_name="tiny", port=free_port(),
                           data_dir=data_dir or tmp_path / f"server{len(started)}",
                           training=TrainingSettings(**training),
                           learner=LearnerSettings(**{"learning_rate": 1e-3, **(learner or {})}), resume=resume,
                           **config)
        bg = BackgroundServer(SwarmServer(cfg, engine, clock)).start()
        started.append(bg)
        return bg

    yield make
    for bg in started:
        if bg._thread.is_alive():
            bg.stop()


def settle(srv) -> None:
    """Until the server's train loop has made a whole pass over what it holds now (``TrainLoop.settled``): after
    this, a step that did not happen will not happen by itself. The event-based way to show that nothing trained."""
    srv.call(srv.server.train_loop.settled())


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(interval)


# ---------------------------------------------------------------- a Hugging Face hub cache, built offline
SHA_MAIN = "a" * 40
SHA_V1 = "b" * 40
LOOPBACK = {"127.0.0.1", "::1", "localhost"}


@pytest.fixture
def network_attempts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Refuse every connection and name lookup off loopback with the errors a machine without a route gives,
    and record each (a library swallows them and falls back to its cache): the test checks the record."""
    attempts: list[str] = []
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def connect(sock: socket.socket, address: object) -> object:
        host = address[0] if isinstance(address, tuple) else str(address)
        if sock.family in (socket.AF_INET, socket.AF_INET6) and host not in LOOPBACK:
            attempts.append(f"connect {address}")
            raise ConnectionRefusedError(f"test socket guard: no connection to {address}")
        return real_connect(sock, address)

    def getaddrinfo(host: object, *args: object, **kwargs: object) -> object:
        if host not in LOOPBACK and host is not None:
            attempts.append(f"resolve {host}")
            raise socket.gaierror(socket.EAI_NONAME, f"test socket guard: no lookup of {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield attempts


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, network_attempts: list[str]) -> Iterator[None]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield
    assert network_attempts == [], "HF_HUB_OFFLINE was set, but something tried the network"


def add_hub_snapshot(cache: Path, repo_id: str, sha: str, source: Path, refs: tuple[str, ...]) -> Path:
    """One snapshot of ``repo_id`` as huggingface_hub stores it: files in blobs/ by hash, snapshots/<sha>/ of
    relative symlinks to them, and refs/<name> holding the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / sha
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for f in sorted(source.iterdir()):
        if not f.is_file() or f.name.startswith(("agentjet-", ".")):
            continue
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        blob = repo / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(f, blob)
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / digest)
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(sha)
    return snap


@pytest.fixture
def hub_cache(tmp_path: Path, tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    cache = tmp_path / "hf-cache"
    snaps = {"main": add_hub_snapshot(cache, "acme/tiny-chat", SHA_MAIN, tiny_model_path, ("main",))}
    snaps["v1"] = add_hub_snapshot(cache, "acme/tiny-chat", SHA_V1, tiny_model_path, ("v1",))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    snaps["cache"] = cache
    return snaps
