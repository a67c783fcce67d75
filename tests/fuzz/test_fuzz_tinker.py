"""Fuzzing the Tinker API (``/api/v1``) of a real server (the tiny model, LoRA adapters, a Tinker key), like the
swarm routes in ``test_fuzz_api.py``.

Invariants: bad input gets a 4xx with ``{"error": <a message>}`` or, for accepted work, a future that fails with
category ``user``; never a 5xx, never a failed future of category ``server``; and one client's bad requests never
fail another's: a second SDK client trains and samples in a thread during every fuzz test, and the fuzzed client's
own valid calls still work after it.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import Api, examples
from .test_fuzz_api import ASCII, JSON, TEXT, blend, maybe

pytestmark = pytest.mark.server
tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402
from tinker.proto import tinker_public_pb2 as pb  # noqa: E402

KEY = "tml-fuzz-key-0123456789"
VOCAB = 1026  # the tiny model's
FUZZ = settings(max_examples=max(20, examples() // 2), deadline=None, database=None,
                suppress_health_check=list(HealthCheck), print_blob=True)
FUZZ_SAMPLE = settings(FUZZ, max_examples=max(15, examples() // 5))  # a mutated body may sample 256 tokens


def check_tinker_error(r: httpx.Response) -> None:
    """A Tinker 4xx: JSON ``{"error": <message>, ...}`` with a real message (the SDK shows ``error``)."""
    assert r.headers.get("content-type", "").startswith("application/json"), (r.status_code, r.text[:300])
    body = r.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), str), body
    assert len(body["error"].strip()) >= 8, body


class TinkerApi(Api):
    check_error = staticmethod(check_tinker_error)

    def tinker(self, route: str, body: Any = None, *, group: str, raw: bytes | None = None,
               key: str | None = KEY, headers: dict[str, str] | None = None) -> httpx.Response:
        h = {"X-API-Key": key} if key is not None else {}
        h.update(headers or {})
        if raw is not None:
            return self.request("POST", f"/api/v1/{route}", raw=raw, headers=h, group=group)
        return self.request("POST", f"/api/v1/{route}", json_body=body, headers=h, group=group)

    def settle(self, r: httpx.Response, group: str) -> None:
        """Accepted work: its future ends with a result or a failure of category ``user``, never ``server``."""
        if r.status_code != 200 or not isinstance(r.json(), dict) or "request_id" not in r.json():
            return
        service = self.server.tinker
        fut = service.futures.find(r.json()["request_id"])
        deadline = time.monotonic() + 5
        while fut is not None and not fut.done.is_set():
            if service.futures.waiting_turn(fut):
                return  # a seq_id ahead of its model's next one: it runs when that one comes
            if time.monotonic() > deadline:
                return  # long work (a sample of thousands of tokens): it ends in the background
            time.sleep(0.002)
        while True:
            f = self.tinker("retrieve_future", {"request_id": r.json()["request_id"]}, group=group)
            assert f.status_code == 200, f.text
            if f.headers.get("content-type", "").startswith("application/json"):
                body = f.json()
                if body.get("type") == "try_again":
                    continue
                if "error" in body:
                    assert body.get("category") == "user", body
            return


class Bystander:
    """A second SDK client that trains and samples in a thread while the fuzzing runs: it must never fail."""

    def __init__(self, url: str) -> None:
        service = tinker.ServiceClient(base_url=url, api_key=KEY)
        self.tc = service.create_lora_training_client(base_model="tiny", rank=2).result()
        self.errors: list[BaseException] = []
        self.rounds = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> None:
        d = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3, 4]),
                        loss_fn_inputs={"target_tokens": [2, 3, 4, 5], "weights": [1.0] * 4})
        self.tc.forward_backward([d], "cross_entropy").result()
        self.tc.optim_step(types.AdamParams(learning_rate=1e-4)).result()
        sc = self.tc.save_weights_and_get_sampling_client().result()
        seq = sc.sample(types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=3, seed=1)
                        ).result().sequences[0]
        assert 1 <= len(seq.tokens) <= 3

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
                self.rounds += 1
            except BaseException as e:  # noqa: BLE001 - reported by the test
                self.errors.append(e)
                return

    def __enter__(self) -> Bystander:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=120)
        assert not self.errors, self.errors
        self.step()  # and once more after it


@pytest.fixture(scope="module")
def tapi(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path, fuzz_counts: Any,
         fuzz_statuses: Any) -> Iterator[TinkerApi]:
    from agentjet.layouts.adapters import adapter_engines
    from agentjet.runtime.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.http.app import BackgroundServer
    from agentjet.settings import GeneratorSettings, LearnerSettings, ServerConfig, TrainingSettings

    learner = LearnerSettings(learning_rate=1e-3, lora={"rank": 2, "adapters": ["swarm"]})
    engine = adapter_engines(tiny_model_path, ["swarm"], GeneratorSettings(max_batch_size=8), learner)
    cfg = ServerConfig(model=str(tiny_model_path), served_model_name="tiny", port=free_port(),
                       data_dir=tmp_path_factory.mktemp("fuzz-tinker"), tinker_key=KEY, learner=learner,
                       training=TrainingSettings(group_size=2, batch_groups=1, checkpoint_every=0, admission=False))
    bg = BackgroundServer(SwarmServer(cfg, engine)).start()
    api = TinkerApi(bg, fuzz_counts, fuzz_statuses)
    try:
        yield api
        assert bg._thread.is_alive(), "the server thread died"
        api.healthy()
    finally:
        api.close()
        bg.stop()


@pytest.fixture(scope="module")
def victim(tapi: TinkerApi) -> dict[str, Any]:
    """The fuzzed client: its session, training client (model id) and a sampling session, made with the SDK."""
    service = tinker.ServiceClient(base_url=tapi.url, api_key=KEY)
    tc = service.create_lora_training_client(base_model="tiny", rank=2).result()
    sc = service.create_sampling_client(base_model="tiny")  # the base: never freed (snapshots of tc may be)
    sc.sample(types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=1)).result()
    session = next(s for s in tapi.server.tinker.sessions.live.values() if tc.model_id in s.models)
    return {"service": service, "tc": tc, "model_id": tc.model_id, "session_id": session.session_id,
            "sampler": next(k for k, x in tapi.server.tinker.samplers.live.items() if x.owner is None), "sc": sc}


@pytest.fixture(scope="module")
def bystander(tapi: TinkerApi, victim: dict[str, Any]) -> Bystander:
    return Bystander(tapi.url)


def still_works(v: dict[str, Any]) -> None:
    """The fuzzed client's own valid calls after the fuzzing: a training step and a sample."""
    tc = v["tc"]
    d = types.Datum(model_input=types.ModelInput.from_ints([3, 4, 5]),
                    loss_fn_inputs={"target_tokens": [4, 5, 6], "weights": [1.0] * 3})
    assert tc.forward_backward([d], "cross_entropy").result().metrics["loss:sum"] > 0
    tc.optim_step(types.AdamParams(learning_rate=1e-4)).result()


# ============================================================================================ strategies
TOKENS = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)
CHUNK = st.fixed_dictionaries({"type": st.just("encoded_text"), "tokens": TOKENS})
PROMPT = st.fixed_dictionaries({"chunks": st.lists(CHUNK, min_size=1, max_size=2)})
SAMPLING = st.fixed_dictionaries({"max_tokens": st.integers(1, 4)}, optional={  # left out: 256 tokens, slow here
    "temperature": st.floats(0, 2), "top_p": st.floats(0.05, 1),
    "top_k": st.integers(-1, 50), "seed": st.integers(0, 2**31), "stop": st.one_of(
        st.lists(st.text(min_size=1, max_size=3), max_size=2), st.lists(st.integers(0, VOCAB - 1), max_size=2))})
ADAM = st.fixed_dictionaries({}, optional={
    "learning_rate": st.floats(0, 1e-2), "beta1": st.floats(0, 0.999), "beta2": st.floats(0, 0.999),
    "eps": st.floats(1e-12, 1e-6), "weight_decay": st.floats(0, 0.1), "grad_clip_norm": st.floats(0, 10)})
NAME = st.one_of(st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}\Z"), TEXT)


def valid_bodies(v: dict[str, Any]) -> dict[str, st.SearchStrategy]:
    mid, sid, sampler = v["model_id"], v["session_id"], v["sampler"]
    seq = st.integers(-3, 10**6)
    return {
        "create_session": st.fixed_dictionaries({"tags": st.lists(TEXT, max_size=2), "sdk_version": ASCII}),
        "session_heartbeat": st.fixed_dictionaries({"session_id": st.just(sid)}),
        "create_model": st.fixed_dictionaries({"session_id": st.just(sid), "base_model": st.sampled_from(
            ["tiny", "other"]), "lora_config": st.fixed_dictionaries({"rank": st.integers(-1, 4)}, optional={
                "train_mlp": st.booleans(), "train_attn": st.booleans(), "train_unembed": st.booleans()})},
            optional={"user_metadata": st.one_of(JSON, st.dictionaries(TEXT, TEXT, max_size=3))}),
        "get_info": st.fixed_dictionaries({"model_id": st.just(mid)}),
        "optim_step": st.fixed_dictionaries({"model_id": st.just(mid), "adam_params": ADAM}, optional={"seq_id": seq}),
        "save_weights_for_sampler": st.fixed_dictionaries({"model_id": st.just(mid)}, optional={
            "path": NAME, "seq_id": seq, "kind": st.sampled_from(["snapshot", "inflight"])}),
        "create_sampling_session": st.fixed_dictionaries({"session_id": st.just(sid)}, optional={
            "base_model": st.sampled_from(["tiny", "x"]), "model_path": st.sampled_from(
                ["tinker://nope/sampler_weights/x", "tinker://../weights/x", ""])}),
        "asample": st.fixed_dictionaries({"prompt": PROMPT, "sampling_params": SAMPLING, "sampling_session_id": st.one_of(
            st.just(sampler), st.just(sampler), st.just("sampler-nope"))}, optional={"num_samples": st.integers(-1, 3),
            "prompt_logprobs": st.booleans(), "prompt_logprobs_last_n": st.integers(-1, 3),
            "topk_prompt_logprobs": st.integers(-1, 25)}),
        "save_weights": st.fixed_dictionaries({"model_id": st.just(mid), "path": NAME}, optional={"seq_id": seq}),
        "load_weights": st.fixed_dictionaries({"model_id": st.just(mid), "path": st.one_of(
            st.just(f"tinker://{mid}/weights/nope"), st.builds(lambda n: f"tinker://{mid}/weights/{n}", NAME), TEXT)},
            optional={"optimizer": st.booleans(), "seq_id": seq}),
        "retrieve_future": st.fixed_dictionaries({"request_id": st.one_of(TEXT, st.just("req-" + "0" * 32))}),
        "telemetry": st.one_of(JSON, st.fixed_dictionaries({"events": st.lists(st.fixed_dictionaries(
            {"severity": st.sampled_from(["ERROR", "INFO", "x"])}, optional={"event_data": JSON, "error_message": TEXT}),
            max_size=3)}, optional={"session_id": TEXT, "sdk_version": JSON})),
        "save_weights_external": st.fixed_dictionaries({"model_id": st.just(mid), "path": NAME}, optional={
            "seq_id": seq, "ttl_seconds": st.one_of(st.integers(-5, 10**10), st.none()),
            "age_encryption_recipients": st.one_of(st.lists(TEXT, max_size=2), JSON)}),
    }


# ============================================================================================ tests
@pytest.mark.parametrize("route", ["create_session", "session_heartbeat", "create_model", "get_info", "optim_step",
                                   "save_weights_for_sampler", "create_sampling_session", "asample", "save_weights",
                                   "load_weights", "retrieve_future", "telemetry", "save_weights_external"])
def test_fuzz_tinker_json_routes(tapi: TinkerApi, victim: dict[str, Any], bystander: Bystander, route: str) -> None:
    valid = valid_bodies(victim)[route]

    @(FUZZ_SAMPLE if route == "asample" else FUZZ)
    @given(body=blend(valid, maybe(JSON)))
    def run(body: Any) -> None:
        r = tapi.tinker(route, body, group=f"hypothesis:tinker-{route}")
        tapi.settle(r, f"hypothesis:tinker-{route}")

    with bystander:
        run()
    still_works(victim)


@st.composite
def fwdbwd_body(draw: st.DrawFn, model_id: str) -> bytes:
    """A ForwardBackwardRequest protobuf: mostly the victim's model, tokens in and out of the vocabulary, loss
    inputs of the right and wrong lengths and dtypes, unknown losses; sometimes a flipped or cut byte."""
    msg = pb.ForwardBackwardRequest(model_id=draw(st.one_of(*[st.just(model_id)] * 4, ASCII)),
                                    seq_id=draw(st.integers(0, 10**6)),
                                    loss_fn=draw(st.sampled_from(["cross_entropy", "importance_sampling", "ppo",
                                                                  "cispo", "dro", "gspo", "stable_reinforce", "x",
                                                                  ""])),
                                    forward_only=draw(st.booleans()))
    for _ in range(draw(st.integers(0, 2))):
        d = msg.data.add()
        n = draw(st.integers(0, 5))
        toks = draw(st.lists(st.integers(-2, VOCAB + 2), min_size=n, max_size=n))
        d.model_input.add().encoded_text.tokens = b"".join(t.to_bytes(4, "little", signed=True) for t in toks)
        m = n + draw(st.integers(-1, 1))
        names = draw(st.lists(st.sampled_from(["weights", "logprobs", "advantages"]), unique=True, max_size=3))
        for name in (["target_tokens"] if draw(st.integers(0, 5)) else []) + names:
            if name == "target_tokens":
                vals = draw(st.lists(st.integers(-2, VOCAB + 2), min_size=max(m, 0), max_size=max(m, 0)))
                dense = b"".join(t.to_bytes(8, "little", signed=True) for t in vals)
                d.loss_fn_inputs[name].CopyFrom(pb.Tensor(dtype=pb.DTYPE_INT64, shape=[len(vals)], dense=dense))
            else:
                vals = draw(st.lists(st.floats(width=32), min_size=max(m, 0), max_size=max(m, 0)))
                dense = b"".join(struct.pack("<f", x) for x in vals)
                d.loss_fn_inputs[name].CopyFrom(pb.Tensor(dtype=draw(st.sampled_from(
                    [pb.DTYPE_FLOAT32, pb.DTYPE_FLOAT32, pb.DTYPE_INT64, 99])), shape=[len(vals)], dense=dense))
    for k in draw(st.lists(st.sampled_from(["clip_low_threshold", "clip_high_threshold", "beta", "x"]), max_size=2)):
        msg.loss_fn_config[k] = draw(st.floats(width=32))
    raw = msg.SerializeToString()
    if draw(st.integers(0, 4)) == 0 and raw:  # a flipped or cut byte
        i = draw(st.integers(0, len(raw) - 1))
        raw = raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1:] if draw(st.booleans()) else raw[:i]
    return raw


def test_fuzz_tinker_forward_backward(tapi: TinkerApi, victim: dict[str, Any], bystander: Bystander) -> None:
    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        raw = data.draw(st.one_of(fwdbwd_body(victim["model_id"]), fwdbwd_body(victim["model_id"]),
                                  st.binary(max_size=64)))
        r = tapi.tinker("forward_backward", raw=raw, group="hypothesis:tinker-forward_backward",
                        headers={"Content-Type": "application/x-protobuf"})
        tapi.settle(r, "hypothesis:tinker-forward_backward")

    with bystander:
        run()
    still_works(victim)


@FUZZ
@given(key=st.one_of(st.none(), ASCII, st.just("tml-"), st.just(KEY + "x")),
       route=st.sampled_from(["create_session", "create_model", "asample", "forward_backward", "retrieve_future",
                              "sessions/x/finish", "nope", "get_server_capabilities"]))
def test_fuzz_tinker_keys(tapi: TinkerApi, key: str | None, route: str) -> None:
    r = tapi.tinker(route, {}, key=key, group="hypothesis:tinker-keys")
    assert r.status_code in (401, 404, 405) if key != KEY else r.status_code < 500


def test_fuzz_tinker_finish_other_ids(tapi: TinkerApi, victim: dict[str, Any]) -> None:
    @FUZZ
    @given(sid=TEXT.filter(lambda s: s != victim["session_id"] and "/" not in s and s not in ("", ".", "..")))
    def run(sid: str) -> None:
        from urllib.parse import quote

        r = tapi.request("POST", f"/api/v1/sessions/{quote(sid.encode('utf-8', 'surrogatepass'), safe='')}/finish",
                         headers={"X-API-Key": KEY}, group="hypothesis:tinker-finish")
        assert r.status_code < 500

    run()
    assert victim["session_id"] in tapi.server.tinker.sessions.live  # another id never ends this session
    still_works(victim)



def test_fuzz_tinker_runs_and_external_weights_paths(tapi: TinkerApi, victim: dict[str, Any]) -> None:
    """GET training_runs/{id}, the external weights' URLs, TTL and delete with any ids, and the signed-URL file route
    with any segments, expiries and signatures: never a 5xx; a file is never served without its signature."""
    from urllib.parse import quote

    # ("." and ".." are dot segments: the client resolves them, out of /api/v1)
    seg = st.one_of(TEXT.filter(lambda x: x not in (".", "..")), st.just(victim["model_id"]),
                    st.just("external_weights"), st.just("x.json"))
    q = st.builds(lambda x: quote(x.encode("utf-8", "surrogatepass"), safe=""), seg)

    # (the query's values are text a client can send: httpx cannot encode a lone surrogate)
    sendable = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)

    @FUZZ
    @given(run=q, cid=st.lists(q, min_size=1, max_size=3), file=q, expires=st.one_of(sendable, st.integers()),
           sig=ASCII, ttl=JSON, which=st.integers(0, 4))
    def run(run: str, cid: list[str], file: str, expires: Any, sig: str, ttl: Any, which: int) -> None:
        h, g = {"X-API-Key": KEY}, "hypothesis:tinker-runs"
        checkpoint = "/".join(cid)
        if which == 0:
            r = tapi.request("GET", f"/api/v1/training_runs/{run}", headers=h, group=g)
        elif which == 1:
            r = tapi.request("GET", f"/api/v1/training_runs/{run}/checkpoints/{checkpoint}/external_weights_urls",
                             headers=h, group=g)
        elif which == 2:
            r = tapi.request("PUT", f"/api/v1/training_runs/{run}/checkpoints/{checkpoint}/ttl", headers=h,
                             json_body={"ttl_seconds": ttl}, group=g)
        elif which == 3:
            r = tapi.request("DELETE", f"/api/v1/training_runs/{run}/checkpoints/{checkpoint}", headers=h, group=g)
        else:
            r = tapi.request("GET", f"/api/v1/external_weights/{run}/{cid[0]}/{file}",
                             params={"expires": str(expires), "sig": sig}, group=g)
            assert r.status_code != 200, r.text[:200]  # no valid signature: nothing served
        assert r.status_code < 500, (which, r.status_code, r.text[:300])

    run()
    still_works(victim)
