"""The Tinker API's handshake and model lifecycle, driven by the official SDK (tinker 0.38.0) against a live server."""

from __future__ import annotations

import os
import time

import httpx
import pytest
from tests.tinker_api.conftest import KEY

pytestmark = pytest.mark.server
tinker = pytest.importorskip("tinker")


def test_capabilities_list_the_served_model_and_a_lora_client_gets_its_own_rank(service_client) -> None:
    client = service_client()
    caps = client.get_server_capabilities()
    tc = client.create_lora_training_client(base_model="tiny", rank=8).result()
    info = tc.get_info()
    assert info.lora_rank == 8 and info.model_id.startswith("tinker-")
    # the served name, then the directory it was loaded from: what a cookbook recipe passes as its model_name (its
    # tokenizer loads from it offline, and create_model takes it as the base_model)
    assert [m.model_name for m in caps.supported_models] == ["tiny", info.model_data.tokenizer_id]
    assert info.model_data.model_name == "tiny" and os.path.isdir(info.model_data.tokenizer_id)
    by_path = client.create_lora_training_client(base_model=info.model_data.tokenizer_id, rank=4).result()
    assert by_path.get_info().lora_rank == 4
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


ROUTES = ["client/config", "create_session", "session_heartbeat", "sessions/x/finish", "telemetry", "create_model",
          "get_info", "retrieve_future", "forward_backward", "optim_step", "save_weights_for_sampler",
          "create_sampling_session", "asample", "save_weights", "load_weights", "save_weights_external"]
BODIES = [b"", b"{", b"null", b"[1]", b'"x"', b"\xff\xfe\x00garbage", b'{"model_id": "nope", "session_id": "nope"}',
          b'{"model_id": 1, "seq_id": "a", "path": "../../etc", "sampling_params": 3, "prompt": {"chunks": [1]}}',
          b'{"sampling_session_id": "x", "prompt": {"chunks": [{"tokens": [1, "a"]}]}, "num_samples": -1}',
          b'{"model_path": "tinker://../x", "base_model": 7, "request_id": ["a"]}']


def test_bad_input_on_every_route_never_gives_a_5xx(tinker_server) -> None:
    srv = tinker_server()
    with httpx.Client(base_url=srv.url + "/api/v1", headers={"X-API-Key": KEY}, timeout=30) as http:
        sid = http.post("/create_session", json={"tags": [], "sdk_version": "0"}).json()["session_id"]
        for route in ROUTES:
            for body in [*BODIES, f'{{"session_id": "{sid}", "base_model": "tiny", "lora_config": {{"rank": 0}}}}'
                         .encode()]:
                r = http.post("/" + route, content=body)
                assert r.status_code < 500, (route, body, r.status_code, r.text)
                if r.status_code == 200 and "request_id" in r.text:  # accepted work: its future fails cleanly
                    f = http.post("/retrieve_future", json={"request_id": r.json()["request_id"]})
                    assert f.status_code == 200 and "error" in f.json(), (route, body, f.text)


def test_a_5_mb_forward_backward_chunk_fits_the_body_limit(tinker_server) -> None:
    from tinker.proto import tinker_public_pb2 as pb

    srv = tinker_server()
    msg = pb.ForwardBackwardRequest(model_id="nope", seq_id=1, loss_fn="cross_entropy")
    for _ in range(1024):
        d = msg.data.add()
        d.model_input.add().encoded_text.tokens = bytes(4 * 300)
        d.loss_fn_inputs["target_tokens"].CopyFrom(pb.Tensor(dtype=pb.DTYPE_INT64, shape=[300], dense=bytes(8 * 300)))
        d.loss_fn_inputs["weights"].CopyFrom(pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[300], dense=bytes(4 * 300)))
    body = msg.SerializeToString()
    assert len(body) > 4_900_000
    r = httpx.post(srv.url + "/api/v1/forward_backward", content=body, timeout=60,
                   headers={"X-API-Key": KEY, "Content-Type": "application/x-protobuf"})
    assert r.status_code == 404 and "nope" in r.text  # read whole and parsed: not a 413


@pytest.mark.parametrize("method,route,names", [
    ("POST", "retrieve_futures", "retrieve_future"), ("POST", "join_sampling_session", "join_sampling_session"),
    ("GET", "training_runs", "training runs"), ("GET", "training_runs/x/checkpoints", "checkpoints"),
    ("POST", "weights_info", "weights_info"), ("POST", "cancel_future", "cancelled"),
    ("POST", "no_such_call", "no_such_call")])
def test_calls_not_served_get_a_404_naming_them(tinker_server, method: str, route: str, names: str) -> None:
    srv = tinker_server()
    r = httpx.request(method, f"{srv.url}/api/v1/{route}", headers={"X-API-Key": KEY}, json={})
    assert r.status_code == 404 and "not served" in r.json()["error"] and names in r.json()["error"], r.text
    assert httpx.request(method, f"{srv.url}/api/v1/{route}", json={}).status_code == 401  # the key first


def test_a_served_route_with_the_wrong_method_is_a_405_naming_the_method(tinker_server) -> None:
    srv = tinker_server()
    r = httpx.get(f"{srv.url}/api/v1/create_session", headers={"X-API-Key": KEY})
    assert r.status_code == 405 and "takes POST" in r.json()["error"], r.text
    r = httpx.post(f"{srv.url}/api/v1/samplers/x", headers={"X-API-Key": KEY})
    assert r.status_code == 405 and "takes GET" in r.json()["error"], r.text
