"""The Tinker API's handshake and model lifecycle, driven by the official SDK (tinker 0.38.0) against a live server."""

from __future__ import annotations

import time

import httpx
import pytest
from tests.tinker_api.conftest import KEY

pytestmark = pytest.mark.server
tinker = pytest.importorskip("tinker")


def test_capabilities_list_the_served_model_and_a_lora_client_gets_its_own_rank(service_client) -> None:
    client = service_client()
    caps = client.get_server_capabilities()
    assert [m.model_name for m in caps.supported_models] == ["tiny"]
    tc = client.create_lora_training_client(base_model="tiny", rank=8).result()
    info = tc.get_info()
    assert info.lora_rank == 8 and info.model_id.startswith("tinker-")
    tok = tc.get_tokenizer()
    assert tok.encode("hi")


def test_without_a_key_the_api_is_a_404_naming_the_flag(tinker_server) -> None:
    srv = tinker_server(key=None)
    r = httpx.post(srv.url + "/api/v1/create_session", json={}, headers={"X-API-Key": KEY})
    assert r.status_code == 404 and "--tinker-key" in r.text


def test_a_wrong_key_gets_the_sdks_auth_error_quickly(tinker_server) -> None:
    srv = tinker_server()
    r = httpx.post(srv.url + "/api/v1/create_session", json={}, headers={"X-API-Key": "tml-wrong"})
    assert r.status_code == 401
    start = time.monotonic()
    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(base_url=srv.url, api_key="tml-wrong").get_server_capabilities()
    assert time.monotonic() - start < 10


def test_an_unknown_base_model_or_flag_fails_cleanly(service_client) -> None:
    client = service_client()
    with pytest.raises(tinker.RequestFailedError, match="not served"):
        client.create_lora_training_client(base_model="other/model", rank=4).result()
    with pytest.raises(tinker.RequestFailedError, match="train_mlp"):
        client.create_lora_training_client(base_model="tiny", rank=4, train_mlp=False).result()


def test_an_unknown_model_id_and_bad_bodies_are_4xx(tinker_server) -> None:
    srv = tinker_server()
    h = {"X-API-Key": KEY}
    r = httpx.post(srv.url + "/api/v1/get_info", json={"model_id": "nope"}, headers=h)
    assert r.status_code == 404 and "nope" in r.text
    for path in ("create_session", "session_heartbeat", "create_model", "get_info", "retrieve_future"):
        for body in (b"{", b"[1]", b'{"session_id": 3, "model_id": [], "request_id": null, "tags": 1}'):
            r = httpx.post(f"{srv.url}/api/v1/{path}", content=body, headers=h)
            assert 400 <= r.status_code < 500, (path, body, r.status_code, r.text)


def test_a_full_weights_server_refuses_tinker_clients_naming_the_fix(service_client) -> None:
    client = service_client(adapters=False)
    with pytest.raises(tinker.RequestFailedError, match="--lora-rank"):
        client.create_lora_training_client(base_model="tiny", rank=4).result()
