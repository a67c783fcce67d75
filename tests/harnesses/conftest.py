"""Fixtures of the harness tests (opt-in: `make test-harnesses`, which installs the CLIs into .harnesses): the CLIs,
a network trap that catches any connection beyond this machine, and a live `ajet server` on tiny-random-64k behind
a recording proxy."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import httpx
import pytest
from tests.harnesses.helpers import NetTrap, RecordingProxy

from agentjet.client.workspace import HarnessNotFound, find_harness
from agentjet.models import TINY_RANDOM_64K
from agentjet.runtime.launch import ServerProcess, free_port
from agentjet.settings import ServerConfig, TrainingSettings

ROOT = Path(__file__).resolve().parents[2]
HARNESSES = ROOT / ".harnesses"
ADMIN = "harness-admin"


def example(name: str) -> ModuleType:
    """``examples/<name>.py`` as a module (the tests run the examples' own commands and workflows)."""
    spec = importlib.util.spec_from_file_location(f"harness_example_{name}", ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _harness(name: str, env_var: str) -> str:
    try:
        return find_harness(name, env_var, HARNESSES)
    except HarnessNotFound as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def codex_bin() -> str:
    return _harness("codex", "AGENTJET_CODEX")


@pytest.fixture(scope="session")
def claude_bin() -> str:
    return _harness("claude", "AGENTJET_CLAUDE")


@pytest.fixture
def net_trap(monkeypatch: pytest.MonkeyPatch) -> Iterator[NetTrap]:
    """Every child started in the test gets this trap as its HTTP(S) proxy, loopback excepted: what a CLI tries to
    reach beyond this machine is refused and listed in ``attempts``."""
    trap = NetTrap().start()
    for key, value in trap.env.items():
        monkeypatch.setenv(key, value)
    yield trap
    trap.stop()


@dataclass
class LiveServer:
    server_url: str  # the server itself (traces are read there, with the admin token)
    proxy: RecordingProxy

    @property
    def url(self) -> str:
        """What clients use: the proxy (the server's public URL, so the begin response points CLIs at it)."""
        return self.proxy.url

    def trace(self, episode_id: str) -> dict:
        got = httpx.get(f"{self.server_url}/swarm/v1/episodes/{episode_id}/trace",
                        headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
        got.raise_for_status()
        return got.json()


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """`ajet server --model tiny-random-64k` as a child process, behind a recording proxy. Groups of one episode:
    an episode is acknowledged, and its group (a single reward) is dropped rather than trained."""
    tmp = tmp_path_factory.mktemp("harness-server")
    proxy = RecordingProxy().start()
    port = free_port()
    proxy.upstream = f"http://127.0.0.1:{port}"
    config = ServerConfig(model=TINY_RANDOM_64K, port=port, public_url=proxy.url, data_dir=tmp / "data",
                          admin_token=ADMIN, training=TrainingSettings(group_size=1, min_group_size=1, checkpoint_every=0))
    server = ServerProcess("harness", config, tmp / "server.log", tmp / "server.yaml").start()
    try:
        server.wait_ready(600)
        yield LiveServer(server.url, proxy)
    finally:
        server.stop(30)
        proxy.stop()
