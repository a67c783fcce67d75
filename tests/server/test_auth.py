"""The admin token is always required: a server started without one generates it (owner-only file in the data
dir and under $AGENTJET_HOME), control and other episodes' traces are refused without it, and `ajet ctl` on the
same machine finds it with no flags."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import httpx

from agentjet.models import agentjet_home
from agentjet.settings.paths import local_admin_token_file

USER = [{"role": "user", "content": "hi"}]


def _ended_episode(url: str, headers: dict | None = None) -> dict:
    ep = httpx.post(f"{url}/swarm/v1/episodes", json={"client_id": "c", "task_id": "t"}, headers=headers).json()
    key = {"Authorization": f"Bearer {ep['api_key']}"}
    assert httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny", "messages": USER}, headers=key).is_success
    assert httpx.post(f"{url}/swarm/v1/episodes/{ep['episode_id']}/end", json={"reward": 1.0}, headers=key).is_success
    return ep


def test_generated_admin_token_guards_control_and_foreign_traces(make_server) -> None:
    srv = make_server(swarm_token="sw4rm")  # a swarm token alone: control must still be closed
    swarm = {"Authorization": "Bearer sw4rm"}
    path = srv.server.config.data_dir / "admin_token"
    token = path.read_text().strip()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(token) > 40
    local = local_admin_token_file(agentjet_home(), srv.server.config.port)
    assert local.read_text().strip() == token and stat.S_IMODE(local.stat().st_mode) == 0o600
    for method, route in (("GET", "config"), ("POST", "config"), ("POST", "pause"), ("POST", "stop")):
        for headers in ({}, swarm):
            r = httpx.request(method, f"{srv.url}/swarm/v1/control/{route}", json={}, headers=headers)
            assert r.status_code == 401 and "admin token" in r.json()["error"]["message"], (route, r.text)
    ep = _ended_episode(srv.url, swarm)
    trace = f"{srv.url}/swarm/v1/episodes/{ep['episode_id']}/trace"
    other = _ended_episode(srv.url, swarm)
    assert httpx.get(trace).status_code == 401
    assert httpx.get(trace, headers=swarm).status_code == 401
    assert httpx.get(trace, headers={"Authorization": f"Bearer {other['api_key']}"}).status_code == 403
    assert httpx.get(trace, headers={"Authorization": f"Bearer {ep['api_key']}"}).status_code == 200  # its own
    assert httpx.get(trace, headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert httpx.post(f"{srv.url}/swarm/v1/control/pause", headers={"Authorization": f"Bearer {token}"}).is_success
    assert srv._thread.is_alive()


def test_ajet_ctl_finds_a_local_servers_token_with_no_flags(make_server) -> None:
    srv = make_server()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTJET_ADMIN_TOKEN")}
    out = subprocess.run([sys.executable, "-m", "agentjet.cli", "ctl", "set", "temperature=0.5", "--server", srv.url],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert srv.server.config.sampling.temperature == 0.5


def test_a_given_admin_token_is_used_and_no_file_is_written(make_server) -> None:
    srv = make_server(admin_token="adm1n")
    assert not (srv.server.config.data_dir / "admin_token").exists()
    r = httpx.get(f"{srv.url}/swarm/v1/control/config", headers={"Authorization": "Bearer adm1n"})
    assert r.status_code == 200 and "adm1n" not in r.text  # the token is never shown


def test_building_a_server_leaves_its_config_alone_and_writes_nothing_until_start(tmp_path, tiny_model_path) -> None:
    """The caller's config is not changed (no generated token, no resolved data dir written into it), and no file
    appears before start(): the token files, the store and the metric files are written when the server starts."""
    from transformers import AutoTokenizer

    from agentjet.layouts.null import null_engine
    from agentjet.runtime.launch import free_port
    from agentjet.server.http.app import BackgroundServer, create_app
    from agentjet.server.swarm import SwarmServer
    from agentjet.settings import ServerConfig

    data_dir = tmp_path / "data"
    config = ServerConfig(model=str(tiny_model_path), served_model_name="tiny", port=free_port(), data_dir=data_dir)
    before = config.model_dump(mode="json")
    local = local_admin_token_file(agentjet_home(), config.port)
    stale = local.read_text() if local.exists() else None  # left by an earlier server on this port, if any
    server = SwarmServer(config, null_engine(AutoTokenizer.from_pretrained(tiny_model_path)))
    create_app(server)
    assert config.model_dump(mode="json") == before and config.admin_token is None
    assert server.config.admin_token is not None and server.config is not config
    assert not data_dir.exists() and (local.read_text() if local.exists() else None) == stale
    bg = BackgroundServer(server).start()
    try:
        token = (data_dir / "admin_token").read_text().strip()
        assert token == server.config.admin_token.get_secret_value() == local.read_text().strip()
        assert (data_dir / "store.sqlite").exists() and server.admin_token_file == data_dir / "admin_token"
        assert config.admin_token is None  # still the caller's own
    finally:
        bg.stop()
