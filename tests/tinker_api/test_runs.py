"""What the Tinker cookbook's recipes need beyond training (issue 50), through the official SDK: a retried poll after
a client-side timeout, training runs with their user_metadata, external weights that download (signed URLs) and
load in PEFT, and the SDK's error events in the server's log."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request
from pathlib import Path

import httpx
import numpy as np
import pytest
from tests.tinker_api.conftest import KEY

pytestmark = pytest.mark.server
tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

ADAM = types.AdamParams(learning_rate=5e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0, grad_clip_norm=1.0)
TOKENS = [1, 5, 9, 13, 17, 21]


def datum(tokens: list[int], **inputs) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], **inputs})


def train(tc, steps: int = 2) -> None:
    for _ in range(steps):
        tc.forward_backward([datum(TOKENS, weights=[1.0] * 5)], "cross_entropy").result()
        tc.optim_step(ADAM).result()


def test_a_poll_retried_after_the_clients_timeout_gets_the_same_result(tinker_server, service_client,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK polls retrieve_future with a read timeout (45 s; here 1 s). The first answer to every future is held
    back past it, as a loaded server or network would: the SDK times out and asks again for the same request id.
    The retry gets the result (it was forgotten once retrieved before issue 50, and the retry was a fatal 404)."""
    from tinker.resources.futures import AsyncFuturesResource

    original = AsyncFuturesResource.retrieve

    async def short_timeout(self, *, request, extra_headers=None, timeout=None, max_retries=None):  # noqa: ANN001
        return await original(self, request=request, extra_headers=extra_headers, timeout=1.0, max_retries=0)

    monkeypatch.setattr(AsyncFuturesResource, "retrieve", short_timeout)
    srv = tinker_server()
    held: dict[str, int] = {}
    inner = srv.app.middleware_stack

    async def hold_first_answers(scope, receive, send):  # noqa: ANN001 - an ASGI app around the server's
        if scope.get("type") != "http" or scope.get("path") != "/api/v1/retrieve_future":
            return await inner(scope, receive, send)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        rid = json.loads(body or b"{}").get("request_id", "")
        sent: list[dict] = []

        async def replay():
            return {"type": "http.request", "body": body, "more_body": False}

        async def keep(message):
            sent.append(message)

        await inner(scope, replay, keep)
        answer = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        if b"try_again" not in answer and rid not in held:
            held[rid] = 1
            await asyncio.sleep(2.5)  # past the client's timeout: this answer is lost
            return
        for m in sent:
            await send(m)

    srv.app.middleware_stack = hold_first_answers
    client = service_client(srv)
    tc = client.create_lora_training_client(base_model="tiny", rank=4).result()  # a JSON result, held once
    out = tc.forward_backward([datum(TOKENS, weights=[1.0] * 5)], "cross_entropy").result()  # protobuf, held once
    tc.optim_step(ADAM).result()
    assert len(held) >= 3  # every one of them was answered only on the retry
    assert len(out.loss_fn_outputs[0]["logprobs"].to_numpy()) == 5 and np.isfinite(out.metrics["loss:sum"])


def test_a_training_run_keeps_the_user_metadata_the_cookbook_stores_and_reads_back(tinker_server, service_client,
                                                                                     tmp_path: Path) -> None:
    """create_lora_training_client(user_metadata=...) and, on resume, get_training_run_by_tinker_path(checkpoint):
    the cookbook stores its renderer_name there. The run outlives the server's process (it is on disk)."""
    data_dir = tmp_path / "run"
    srv = tinker_server(data_dir=data_dir)
    client = service_client(srv)
    meta = {"renderer_name": "qwen3_instruct", "recipe": "recipe_chat_sl"}
    tc = client.create_lora_training_client(base_model="tiny", rank=4, user_metadata=meta).result()
    rest = client.create_rest_client()
    run = rest.get_training_run(tc.model_id).result()
    assert run.user_metadata == meta and run.lora_rank == 4 and run.is_lora and run.base_model == "tiny"
    assert run.last_checkpoint is None
    train(tc, 1)
    path = tc.save_state("step-1").result().path
    run = rest.get_training_run_by_tinker_path(path).result()
    assert run.user_metadata == meta and run.last_checkpoint is not None
    assert run.last_checkpoint.tinker_path == path and run.last_checkpoint.checkpoint_type == "training"
    # a client made from the state is a run of its own, with the metadata it was given
    resumed = client.create_training_client_from_state(path, user_metadata={"renderer_name": "other"}).result()
    assert rest.get_training_run(resumed.model_id).result().user_metadata == {"renderer_name": "other"}
    with pytest.raises(tinker.NotFoundError):
        rest.get_training_run("no-such-run").result()
    srv.stop()
    again = tinker_server(data_dir=data_dir)  # a restart: the run is read from disk
    run = service_client(again).create_rest_client().get_training_run_by_tinker_path(path).result()
    assert run.user_metadata == meta


def test_save_weights_external_downloads_by_signed_urls_and_loads_in_peft(tinker_server, service_client,
                                                                          tmp_path: Path) -> None:
    """save_weights_external -> get_external_weights_urls -> plain HTTP GETs (no API key, as the cookbook's
    urllib): a PEFT adapter directory whose logprobs on the served base equal the training client's forward."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    srv = tinker_server()
    client = service_client(srv)
    tc = client.create_lora_training_client(base_model="tiny", rank=4).result()
    train(tc)
    path = tc.save_weights_external("final").result().path
    rest = client.create_rest_client()
    urls = rest.get_external_weights_urls(path).result()
    assert set(urls.urls) == {"adapter_config.json", "adapter_model.safetensors"}
    out = tmp_path / "adapter"
    out.mkdir()
    for name, url in urls.urls.items():
        urllib.request.urlretrieve(url, str(out / name))
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and Path(config["base_model_name_or_path"]).is_dir()
    base = AutoModelForCausalLM.from_pretrained(tc.get_info().model_data.tokenizer_id, dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, str(out)).eval()
    with torch.no_grad():
        logits = peft(torch.tensor([TOKENS[:-1]])).logits[0].float()
    theirs = torch.log_softmax(logits, -1)[torch.arange(5), torch.tensor(TOKENS[1:])].numpy()
    ours = tc.forward([datum(TOKENS, weights=[1.0] * 5)], "cross_entropy").result()
    assert np.allclose(theirs, ours.loss_fn_outputs[0]["logprobs"].to_numpy(), atol=1e-4)
    # a URL is its own credential: a changed signature or file name is refused
    bad = urls.urls["adapter_config.json"].replace("sig=", "sig=0")
    assert httpx.get(bad).status_code == 403
    assert httpx.get(urls.urls["adapter_config.json"].replace("adapter_config.json", "run.json")).status_code == 403
    # the TTL is checked; delete removes the export
    rest.set_checkpoint_ttl_from_tinker_path(path, 7200).result()
    with pytest.raises(tinker.BadRequestError, match="ttl_seconds"):
        rest.set_checkpoint_ttl_from_tinker_path(path, 5).result()
    rest.delete_checkpoint_from_tinker_path(path).result()
    with pytest.raises(tinker.NotFoundError):
        rest.get_external_weights_urls(path).result()


def test_external_weights_encrypted_to_an_age_recipient_decrypt_to_the_same_files(tinker_server, service_client,
                                                                                  tmp_path: Path) -> None:
    """What tinker_cookbook.weights.download does for a save_state path: a client from the state, an export
    encrypted to a key made for the download, each file fetched and decrypted."""
    import pyrage

    srv = tinker_server()
    client = service_client(srv)
    tc = client.create_lora_training_client(base_model="tiny", rank=4).result()
    train(tc, 1)
    state = tc.save_state("s1").result().path
    identity = pyrage.x25519.Identity.generate()
    loaded = client.create_training_client_from_state(state).result()
    secret = loaded.save_weights_external("download", ttl_seconds=3600,
                                          age_encryption_recipients=[str(identity.to_public())]).result().path
    plain = tc.save_weights_external("plain").result().path
    rest = client.create_rest_client()
    enc, clear = rest.get_external_weights_urls(secret).result().urls, rest.get_external_weights_urls(plain).result().urls
    assert set(enc) == {"adapter_config.json.age", "adapter_model.safetensors.age"}
    got = {name.removesuffix(".age"): pyrage.decrypt(urllib.request.urlopen(url).read(), [identity])
           for name, url in enc.items()}
    assert got["adapter_model.safetensors"] == urllib.request.urlopen(clear["adapter_model.safetensors"]).read()
    with pytest.raises(tinker.RequestFailedError, match="age or SSH public key"):
        tc.save_weights_external("x", age_encryption_recipients=["not-a-key"]).result()


def test_the_sdks_error_events_are_kept_in_the_server_log(tinker_server, caplog: pytest.LogCaptureFixture) -> None:
    srv = tinker_server()
    event = {"event": "UNHANDLED_EXCEPTION", "event_id": "e1", "event_session_index": 0, "severity": "ERROR",
             "timestamp": "2026-12-01T00:00:00Z", "error_type": "RequestFailedError", "error_message": "it broke"}
    with caplog.at_level(logging.WARNING, logger="agentjet.server.tinker.telemetry"):
        r = httpx.post(srv.url + "/api/v1/telemetry", headers={"X-API-Key": KEY},
                       json={"events": [event], "platform": "linux", "sdk_version": "0.38.0", "session_id": "s-9",
                             "process_uuid": "p"})
        assert r.status_code == 200
    assert any("RequestFailedError it broke" in x.getMessage() and "session s-9" in x.getMessage()
               for x in caplog.records)
