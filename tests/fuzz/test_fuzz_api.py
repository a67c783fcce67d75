"""Fuzzing the HTTP API of a real swarm server (null engine, swarm and admin tokens set).

Invariant 5: bad input gets a 4xx in OpenAI's error shape; never a 5xx, a hang or a crash.
Invariant 6: control needs the admin token; an episode key works for its own episode only.

Two parts:
- property-based fuzzing with hypothesis: JSON bodies of random shapes and types per endpoint (mostly
  well-formed on the outside, so the deep validation is reached), random tokens, ids and raw bytes.
  Every answer is < 500, every error is in OpenAI's shape, and a refused request changes nothing.
- a hand-written list of nasty inputs, each with its exact status and a meaningful message.

``AGENTJET_FUZZ_EXAMPLES=2000 pytest tests/fuzz`` for a longer run (default 150 per endpoint).
"""

from __future__ import annotations

import copy
import json
import math
import socket
import time
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentjet.protocol import EpisodeStatus

from .conftest import ADMIN_TOKEN, MAX_BODY, SWARM_TOKEN, Api, assert_error_shape, examples

FUZZ = settings(max_examples=examples(), deadline=None, database=None, suppress_health_check=list(HealthCheck),
                print_blob=True)
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
MAX_ABS_REWARD = 1e9


def expect(r: httpx.Response, status: int, *fragments: str) -> dict[str, Any]:
    """Exactly ``status``, OpenAI's error shape, and a message naming the problem (one of ``fragments``)."""
    assert r.status_code == status, (r.status_code, r.text[:500])
    err = assert_error_shape(r)
    msg = err["message"].lower()
    assert not fragments or any(f.lower() in msg for f in fragments), (fragments, err)
    return err


def episode(api: Api, eid: str):  # noqa: ANN201
    return api.server.registry.get(eid)


def snapshot(api: Api) -> tuple:
    """Everything a refused request must leave alone."""
    s = api.server
    return (json.dumps(s.public_config(), sort_keys=True, default=str), len(s.control.change_log), s.train_loop.paused,
            s.state, s.registry.counts["begun"], s.registry.open_count,
            sum(s.reader.count_by_status().values()))  # rows stored (the trainer moves statuses meanwhile)


# ============================================================================================ strategies
SURROGATE = st.sampled_from(["\ud800", "\udfff", "a\udc80b"])
WEIRD = st.sampled_from(["", " ", "\x00", "a\x00b", "../../etc/passwd", "..", "%2e%2e%2f", "\u202egnp.exe", "🦀" * 3,
                         "ep-" + "0" * 32, "aj-ep-guess", "<tool_call>{\"name\": \"f\"}</tool_call>", "null", "NaN",
                         "\\u0000", "' OR 1=1 --", "{{ 7*7 }}", "{% raw %}", "x" * 300])
TEXT = st.one_of(st.text(max_size=30), WEIRD, SURROGATE)
NUMBER = st.one_of(st.integers(-3, 5000), st.integers(-(10**40), 10**40), st.floats(allow_nan=True, allow_infinity=True))
SCALAR = st.one_of(st.none(), st.booleans(), NUMBER, TEXT)
JSON = st.recursive(SCALAR, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(TEXT, c, max_size=4)),
                    max_leaves=10)
ASCII = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40)


def urlsafe(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")


def maybe(strategy: st.SearchStrategy, p_junk: int = 5) -> st.SearchStrategy:
    """Mostly ``strategy``, sometimes any JSON value at all."""
    return st.one_of(*([strategy] * p_junk), JSON)


@st.composite
def mutate(draw: st.DrawFn, base: st.SearchStrategy) -> Any:
    """A valid body with 1-3 random edits anywhere inside it: a value replaced by any JSON, a key or an item
    removed, a junk key added. Reaches the validation deep inside bodies that are otherwise right."""
    def walk(node: Any, spots: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:  # (container, key or index)
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            spots.append((node, k))
            walk(v, spots)
        return spots

    body = copy.deepcopy(draw(base))
    for _ in range(draw(st.integers(1, 3))):
        spots = walk(body, [])
        if not spots:
            return draw(JSON)
        node, k = draw(st.sampled_from(spots))
        op = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if op == "replace":
            node[k] = draw(JSON)
        elif op == "delete":
            del node[k]
        elif isinstance(node, dict):
            node[draw(TEXT)] = draw(JSON)
        else:
            node.append(draw(JSON))
    return body


def blend(valid: st.SearchStrategy, junky: st.SearchStrategy) -> st.SearchStrategy:
    """Valid bodies (the deep paths: rendering, recording, storing), mutated ones, and random shapes."""
    return st.one_of(valid, mutate(valid), valid, mutate(valid), junky)


# --- chat
VTEXT = st.text(max_size=30)  # any Unicode (NUL, RTL, emoji...) but valid: lone surrogates are in TEXT
VROLE = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"])
VPART = st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text"]), "text": VTEXT})
VCONTENT = st.one_of(VTEXT, VTEXT, st.none(), st.lists(VPART, max_size=3))
VARGS = st.one_of(st.dictionaries(VTEXT, st.one_of(VTEXT, st.integers(), st.booleans()), max_size=3).map(json.dumps),
                  st.dictionaries(VTEXT, VTEXT, max_size=2), st.just(""))
VTOOL_CALL = st.fixed_dictionaries({"id": VTEXT, "type": st.just("function"),
                                    "function": st.fixed_dictionaries({"name": VTEXT, "arguments": VARGS})})
VMESSAGE = st.one_of(
    st.fixed_dictionaries({"role": VROLE, "content": VCONTENT}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.one_of(st.none(), VTEXT),
                           "tool_calls": st.lists(VTOOL_CALL, min_size=1, max_size=2)}),
    st.fixed_dictionaries({"role": st.just("tool"), "content": VTEXT, "tool_call_id": VTEXT},
                          optional={"name": VTEXT}))
VTOOL = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": VTEXT}, optional={"description": VTEXT, "parameters": st.just({"type": "object", "properties": {}})})})
VALID_CHAT = st.fixed_dictionaries(
    {"messages": st.lists(VMESSAGE, min_size=1, max_size=4)},
    optional={"model": st.text(max_size=40), "tools": st.lists(VTOOL, max_size=2),
              "tool_choice": st.sampled_from(["none", "auto"]), "temperature": st.floats(0, 2),
              "top_p": st.floats(0.01, 1), "top_k": st.integers(0, 50), "max_tokens": st.integers(1, 64),
              "max_completion_tokens": st.integers(1, 64), "stop": st.lists(st.text(min_size=1, max_size=5), max_size=4),
              "seed": st.integers(-(2**63), 2**63), "n": st.integers(1, 3), "logprobs": st.booleans(),
              "stream": st.booleans(), "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
              "presence_penalty": st.just(0.0), "response_format": st.just({"type": "text"}), "user": VTEXT})

ROLE = maybe(VROLE, 8)
PART = maybe(st.fixed_dictionaries({"type": maybe(st.sampled_from(["text", "input_text", "image_url"])),
                                    "text": maybe(TEXT)}))
CONTENT = st.one_of(TEXT, st.none(), st.lists(PART, max_size=3), JSON)
ARGS = st.one_of(st.just("{bad"), st.just(""), JSON.map(lambda v: json.dumps(v, allow_nan=True)), JSON)
TOOL_CALL = maybe(st.fixed_dictionaries(
    {"id": maybe(TEXT), "type": st.just("function"),
     "function": maybe(st.fixed_dictionaries({"name": maybe(TEXT)}, optional={"arguments": ARGS}))}))
MESSAGE = maybe(st.fixed_dictionaries(
    {"role": ROLE}, optional={"content": CONTENT, "tool_calls": maybe(st.lists(TOOL_CALL, max_size=2)),
                              "tool_call_id": maybe(TEXT), "name": maybe(TEXT)}), 10)
TOOL = maybe(st.fixed_dictionaries({"type": maybe(st.just("function")),
                                    "function": maybe(st.fixed_dictionaries({"name": maybe(TEXT)},
                                                                            optional={"parameters": JSON}))}))
SMALL_INT = maybe(st.integers(-2, 40))
JUNKY_CHAT = maybe(st.fixed_dictionaries(
    {"messages": maybe(st.lists(MESSAGE, min_size=0, max_size=4), 10)},
    optional={"model": maybe(TEXT), "tools": maybe(st.lists(TOOL, max_size=2)),
              "tool_choice": maybe(st.sampled_from(["none", "auto", "required"])),
              "temperature": maybe(st.floats(-1, 3)), "top_p": maybe(st.floats(-0.5, 1.5)), "top_k": SMALL_INT,
              "max_tokens": maybe(st.integers(-2, 5000)), "max_completion_tokens": SMALL_INT,
              "stop": maybe(st.one_of(TEXT, st.lists(TEXT, max_size=6))), "seed": maybe(st.integers()),
              "n": maybe(st.integers(-1, 20)), "logprobs": maybe(st.booleans()), "top_logprobs": maybe(st.integers(-1, 25)),
              "stream": maybe(st.booleans()), "stream_options": maybe(st.fixed_dictionaries({"include_usage": JSON})),
              "presence_penalty": maybe(st.floats(allow_nan=True)), "frequency_penalty": maybe(st.just(0.0)),
              "logit_bias": JSON, "response_format": maybe(st.fixed_dictionaries({"type": maybe(st.just("text"))})),
              "user": JSON, "parallel_tool_calls": JSON}), 12)
CHAT_BODY = blend(VALID_CHAT, JUNKY_CHAT)


# --- end
def end_body(agents: list[str]) -> st.SearchStrategy:
    scalar = st.one_of(st.floats(-MAX_ABS_REWARD, MAX_ABS_REWARD), st.integers(-1000, 1000))
    reward = st.one_of(scalar, st.fixed_dictionaries(dict.fromkeys(agents, scalar))) if agents else scalar
    valid = st.fixed_dictionaries({"reward": reward}, optional={"metadata": st.dictionaries(VTEXT, JSON, max_size=3)})
    junk_reward = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**12), 10**12),
                            st.dictionaries(st.one_of(AGENTS, TEXT), st.floats(allow_nan=True, allow_infinity=True),
                                            max_size=3), JSON)
    junky = maybe(st.fixed_dictionaries({"reward": junk_reward}, optional={
        "metadata": maybe(st.dictionaries(TEXT, JSON)), "ignore_unused_agents": JSON, "extra": JSON}), 10)
    return blend(valid, junky)


AGENTS = st.sampled_from(["default", "a1", "a2"])
END_BODY = end_body(["default"])

# --- join, begin
VIDENT = st.from_regex(r"\A[A-Za-z0-9_.:@/+=-]{1,20}\Z")
IDENT = st.one_of(VIDENT, TEXT, JSON)
VALID_BEGIN = st.fixed_dictionaries({"client_id": VIDENT, "task_id": VIDENT}, optional={
    "task_type": VIDENT, "group_id": st.one_of(st.none(), VIDENT), "eval": st.booleans(),
    "metadata": st.dictionaries(VTEXT, JSON, max_size=3)})
BEGIN_BODY = blend(VALID_BEGIN, maybe(st.fixed_dictionaries(
    {"client_id": maybe(IDENT), "task_id": maybe(IDENT)},
    optional={"task_type": maybe(IDENT), "group_id": maybe(IDENT), "eval": maybe(st.booleans()),
              "metadata": maybe(st.dictionaries(TEXT, JSON)), "labels": JSON, "extra": JSON}), 10))
VALID_JOIN = st.fixed_dictionaries({"client_id": VIDENT}, optional={"labels": st.dictionaries(VTEXT, VTEXT, max_size=3)})
JOIN_BODY = blend(VALID_JOIN, maybe(st.fixed_dictionaries(
    {"client_id": maybe(IDENT)}, optional={"labels": maybe(st.dictionaries(TEXT, TEXT)), "extra": JSON}), 10))

# --- control/config
VALID_TRAINING = st.fixed_dictionaries({}, optional={
    "group_size": st.integers(2, 8), "batch_groups": st.integers(1, 4), "min_group_size": st.integers(1, 2),
    "group_timeout_s": st.floats(0.5, 1000), "drop_uniform_groups": st.booleans(),
    "estimator": st.sampled_from(["grpo", "rloo", "reinforce"]), "max_staleness": st.integers(0, 10),
    "keep_checkpoints": st.integers(1, 3)})
VALID_LEARNER = st.fixed_dictionaries({}, optional={"learning_rate": st.floats(1e-6, 0.1)})
VALID_SAMPLING = st.fixed_dictionaries({}, optional={
    "temperature": st.floats(0, 5), "top_p": st.floats(0.01, 1), "max_tokens": st.integers(1, 512)})
VALID_CONFIG = st.fixed_dictionaries({}, optional={"training": VALID_TRAINING, "sampling": VALID_SAMPLING,
                                                   "learner": VALID_LEARNER})
TRAINING_KEYS = ["group_size", "batch_groups", "min_group_size", "group_timeout_s", "drop_uniform_groups", "estimator",
                 "max_staleness", "learning_rate", "checkpoint_every", "keep_checkpoints"]
SETTING_VALUE = st.one_of(st.integers(-2, 2000), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                          st.sampled_from(["grpo", "rloo", "reinforce", "ppo"]), JSON)
CONFIG_BODY = blend(VALID_CONFIG, maybe(st.fixed_dictionaries({}, optional={
    "training": maybe(st.dictionaries(st.one_of(st.sampled_from(TRAINING_KEYS), TEXT), SETTING_VALUE, max_size=3)),
    "learner": maybe(st.dictionaries(st.one_of(st.sampled_from(["learning_rate", "weight_decay", "lora"]), TEXT),
                                     SETTING_VALUE, max_size=2)),
    "sampling": maybe(st.dictionaries(st.one_of(st.sampled_from(["temperature", "top_p", "max_tokens"]), TEXT),
                                      SETTING_VALUE, max_size=2)),
    "extra": JSON}), 10))


def bad_token(valid: list[str]) -> st.SearchStrategy:
    """Tokens that must not authorise: none, random, near misses of the real ones, other kinds of token."""
    near = [t[:-1] for t in valid] + [t + "x" for t in valid] + [t.upper() for t in valid] + [t[::-1] for t in valid]
    return st.one_of(st.none(), st.just(""), ASCII, *([st.sampled_from(near)] if near else []))


# ============================================================================================ fixtures
@pytest.fixture(scope="module")
def chat_ep(api: Api) -> dict[str, Any]:
    return api.begin(client_id="fuzz-chat")


@pytest.fixture(scope="module")
def control_api(fuzz_server_factory: Any) -> Api:
    """A server of its own for the admin-token fuzzing (which really changes settings)."""
    return fuzz_server_factory()


# ============================================================================================ property-based
@FUZZ
@given(body=CHAT_BODY, agent=st.one_of(st.none(), ASCII))
def test_fuzz_chat_completions(api: Api, chat_ep: dict[str, Any], body: Any, agent: str | None) -> None:
    ep = episode(api, chat_ep["episode_id"])
    before = len(ep.calls)
    r = api.post(CHAT, body, token=chat_ep["api_key"], headers={"X-Agent-Name": agent} if agent else None,
                 group="hypothesis:chat")
    if r.status_code == 200:
        if isinstance(body, dict) and body.get("stream") is True:
            assert r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]
            assert len(ep.calls) == before + 1
        else:
            out = r.json()
            assert out["object"] == "chat.completion" and out["choices"]
            assert len(ep.calls) == before + len(out["choices"])
    else:
        assert 400 <= r.status_code < 500
        assert len(ep.calls) == before, "a refused call was recorded"
    assert ep.is_open
    if len(ep.calls) > 200:
        ep.calls.clear()  # keep the shared episode small


@FUZZ
@given(agents=st.lists(st.sampled_from(["default", "a1", "a2"]), max_size=2, unique=True), data=st.data())
def test_fuzz_end(api: Api, agents: list[str], data: st.DataObject) -> None:
    body = data.draw(end_body(agents), label="body")
    ep = api.begin(client_id="fuzz-end", task_id="t-end")
    for a in agents:
        api.chat_ok(ep, agent=None if a == "default" else a)
    before = snapshot(api)
    eid = ep["episode_id"]
    r = api.post(f"/swarm/v1/episodes/{eid}/end", body, token=ep["api_key"], group="hypothesis:end")
    live = episode(api, eid)
    stored = api.server.store.get_episode(eid)
    if r.status_code == 200:
        assert live.status is EpisodeStatus.ENDED and stored is not None
        assert r.json()["calls"] == len(agents)
        reward = body["reward"]
        values = list(reward.values()) if isinstance(reward, dict) else [reward]
        assert all(math.isfinite(float(v)) and abs(float(v)) <= MAX_ABS_REWARD for v in values), reward
    else:
        assert 400 <= r.status_code < 500
        assert live.is_open and len(live.calls) == len(agents), "a refused end changed the episode"
        assert stored is None, "a refused end was stored"
        assert snapshot(api)[:5] == before[:5]
        r = api.post(f"/swarm/v1/episodes/{eid}/abort", {"reason": "fuzz"}, token=ep["api_key"], group="setup")
        assert r.status_code == 200


@FUZZ
@given(which=st.sampled_from(["join", "episodes"]), data=st.data(),
       token=st.tuples(st.booleans(), st.one_of(bad_token([SWARM_TOKEN, ADMIN_TOKEN]), st.just(ADMIN_TOKEN)))
       .map(lambda t: SWARM_TOKEN if t[0] else t[1]))  # the right token half of the time
def test_fuzz_join_and_begin(api: Api, which: str, data: st.DataObject, token: str | None) -> None:
    body = data.draw(JOIN_BODY if which == "join" else BEGIN_BODY)
    begun = api.server.registry.counts["begun"]
    r = api.post(f"/swarm/v1/{which}", body, token=token, group=f"hypothesis:{which}")
    if token != SWARM_TOKEN:
        assert r.status_code in (400, 401), r.text  # bodies are validated first, then the token
    if r.status_code != 200:
        assert api.server.registry.counts["begun"] == begun
        return
    out = r.json()
    if which == "episodes":
        assert api.server.registry.counts["begun"] == begun + 1
        assert out["api_key"].startswith("aj-ep-") and len(out["api_key"]) >= 40
        assert episode(api, out["episode_id"]).client_id == body["client_id"]
        r = api.post(f"/swarm/v1/episodes/{out['episode_id']}/abort", token=out["api_key"], group="setup")
        assert r.status_code == 200


@FUZZ
@given(action=st.sampled_from(["heartbeat", "end", "abort"]),
       who=st.sampled_from(["own", "other", "bad", "swarm", "admin"]), bad=bad_token([]),
       target=st.one_of(st.just("own"), st.just("other"), TEXT), body=st.one_of(st.none(), END_BODY, JSON))
def test_fuzz_episode_keys_and_ids(api: Api, action: str, who: str, bad: str | None, target: str, body: Any) -> None:
    a, b = api.begin(client_id="fuzz-keys"), api.begin(client_id="fuzz-keys")
    key = {"own": a["api_key"], "other": b["api_key"], "bad": bad, "swarm": SWARM_TOKEN, "admin": ADMIN_TOKEN}[who]
    eid = {"own": a["episode_id"], "other": b["episode_id"]}.get(target) or quote(urlsafe(target), safe="")
    r = api.post(f"/swarm/v1/episodes/{eid}/{action}", body, token=key, group="hypothesis:keys")
    may_change = {a["episode_id"]: who == "own" and eid == a["episode_id"],
                  b["episode_id"]: who == "other" and eid == b["episode_id"]}
    if not any(may_change.values()):
        assert r.status_code >= 400, r.text
        if who in ("bad", "swarm", "admin") and r.status_code != 404:
            assert r.status_code in (400, 401), r.text  # bodies are validated first, then the key
        if who == "other" and eid == a["episode_id"]:
            assert r.status_code in (400, 403), r.text
    for ep in (a, b):
        if not may_change[ep["episode_id"]]:
            live = episode(api, ep["episode_id"])
            assert live.is_open, f"{action} with someone else's key changed episode {ep['episode_id']}"
            assert api.server.store.get_episode(ep["episode_id"]) is None
        api.post(f"/swarm/v1/episodes/{ep['episode_id']}/abort", token=ep["api_key"], group="setup")


CONTROL = [("GET", "config"), ("POST", "config"), ("POST", "pause"), ("POST", "resume"), ("POST", "checkpoint"),
           ("POST", "stop")]


@FUZZ
@given(call=st.sampled_from(CONTROL), token=st.one_of(bad_token([ADMIN_TOKEN, SWARM_TOKEN]), st.just(SWARM_TOKEN)),
       scheme=st.sampled_from(["Bearer", "bearer", "Basic", "Token", ""]), body=st.one_of(st.none(), CONFIG_BODY))
def test_fuzz_control_without_admin_token(api: Api, call: tuple[str, str], token: str | None, scheme: str,
                                          body: Any) -> None:
    method, path = call
    before = snapshot(api)
    headers = {"Authorization": f"{scheme} {ADMIN_TOKEN}".strip()} if scheme not in ("Bearer", "bearer") else None
    r = api.request(method, f"/swarm/v1/control/{path}", json_body=body if method == "POST" else None,
                    token=token if headers is None else None, headers=headers, group="hypothesis:control-denied")
    if method == "POST" and path == "config":
        assert r.status_code in (400, 401), r.text  # the body is validated first, then the token
    else:
        expect(r, 401, "admin token")
    assert snapshot(api) == before
    assert not (api.server.config.data_dir / "checkpoints").exists()


@FUZZ
@given(body=CONFIG_BODY)
def test_fuzz_control_config_with_admin_token(control_api: Api, body: Any) -> None:
    api = control_api
    before = snapshot(api)
    r = api.post("/swarm/v1/control/config", body, token=ADMIN_TOKEN, group="hypothesis:control-config")
    if r.status_code != 200:
        assert snapshot(api) == before, "a refused settings change was (partly) applied"
        return
    # an accepted change keeps the server serving and reporting
    assert api.get("/swarm/v1/control/config", token=ADMIN_TOKEN, group="hypothesis:control-config").status_code == 200
    assert api.get("/swarm/v1/status", token=ADMIN_TOKEN, group="hypothesis:control-config").status_code == 200
    ep = api.begin(client_id="fuzz-cfg")
    api.chat_ok(ep)
    api.post(f"/swarm/v1/episodes/{ep['episode_id']}/abort", token=ep["api_key"], group="setup")


ENDPOINTS = ["/v1/chat/completions", "/swarm/v1/join", "/swarm/v1/episodes", "/swarm/v1/episodes/{id}/heartbeat",
             "/swarm/v1/episodes/{id}/end", "/swarm/v1/episodes/{id}/abort", "/swarm/v1/control/config"]
RAW = st.one_of(st.binary(max_size=200), TEXT.map(lambda s: s.encode("utf-8", "surrogatepass")),
                JSON.map(lambda v: json.dumps(v, allow_nan=True)[:-1].encode()),  # truncated JSON
                st.sampled_from([b"", b"{", b"[" * 5000, b"\xff\xfe{}", b'{"a":1}{"b":2}', b'{"reward": 1e99999}',
                                 b'\x00', b'{"messages": [' + b'{"role":"user","content":"x"},' * 5 + b']']))
CONTENT_TYPE = st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded",
                                "multipart/form-data; boundary=x", "application/json; charset=latin-1",
                                "application/vnd+json", "", "application/octet-stream"])


@FUZZ
@given(path=st.sampled_from(ENDPOINTS), raw=RAW, ctype=CONTENT_TYPE)
def test_fuzz_raw_bodies_and_content_types(api: Api, chat_ep: dict[str, Any], path: str, raw: bytes,
                                           ctype: str) -> None:
    ep = api.begin(client_id="fuzz-raw")
    token = {"/v1": ep["api_key"], "/swarm/v1/join": SWARM_TOKEN, "/swarm/v1/episodes": SWARM_TOKEN,
             "/swarm/v1/control": ADMIN_TOKEN}
    tok = next((t for p, t in token.items() if path.startswith(p)), ep["api_key"])
    tok = ep["api_key"] if "{id}" in path else tok
    r = api.request("POST", path.format(id=ep["episode_id"]), raw=raw, token=tok,
                    headers={"Content-Type": ctype} if ctype else None, group="hypothesis:raw")
    if path.endswith("/end") and r.status_code != 200:
        assert api.server.store.get_episode(ep["episode_id"]) is None
    if path == CHAT and r.status_code != 200:
        assert episode(api, ep["episode_id"]).calls == []
    api.post(f"/swarm/v1/episodes/{ep['episode_id']}/abort", token=ep["api_key"], group="setup")


@FUZZ
@given(prefix=st.sampled_from(["", "/v1", "/v1/chat", "/swarm/v1", "/swarm/v1/episodes", "/swarm/v1/control"]),
       rest=TEXT, method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]))
def test_fuzz_unknown_routes_and_methods(api: Api, prefix: str, rest: str, method: str) -> None:
    r = api.request(method, f"{prefix}/{quote(urlsafe(rest), safe='/')}", group="hypothesis:routes")
    known = {"/health", "/v1/models", "/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"}
    if r.request.url.path not in known and r.status_code not in (307, 308):  # (307: a trailing slash redirect)
        assert 400 <= r.status_code < 500, (r.request.url.path, r.status_code)
    assert api.server.state == "ready"


# ============================================================================================ nasty inputs
DEEP_ARGS = {"name": "f", "arguments": json.loads("[" * 900 + "]" * 900)}
HUGE_INT = "9" * 5000


def _raw(body: str) -> bytes:
    return body.encode()


# (id, body: dict or raw bytes, extra headers, status, fragments of the message)
CHAT_NASTY: list[tuple[str, Any, dict[str, str] | None, int, tuple[str, ...]]] = [
    ("malformed-json", b"{not json", None, 400, ("json",)),
    ("truncated-json", b'{"messages": [{"role": "user"', None, 400, ("json",)),
    ("two-json-docs", b'{"messages": []}{"x": 1}', None, 400, ("json",)),
    ("invalid-utf8", b'{"messages": "\xff\xfe"}', None, 400, ("pars", "json", "utf")),
    ("empty-body", b"", None, 400, ("required",)),
    ("json-null", b"null", None, 400, ("required", "dictionary")),
    ("json-list", b"[]", None, 400, ("dictionary", "object")),
    ("json-string", b'"hello"', None, 400, ("dictionary", "object")),
    ("wrong-content-type", json.dumps({"model": "tiny", "messages": USER}).encode(), {"Content-Type": "text/plain"},
     400, ("dictionary", "object")),
    ("form-content-type", b"messages=hi", {"Content-Type": "application/x-www-form-urlencoded"}, 400,
     ("dictionary", "object")),
    ("no-messages", {"model": "tiny"}, None, 400, ("messages",)),
    ("messages-string", {"messages": "hi"}, None, 400, ("messages",)),
    ("messages-empty", {"messages": []}, None, 400, ("at least one message",)),
    ("message-not-object", {"messages": [1]}, None, 400, ("must be an object",)),
    ("unknown-role", {"messages": [{"role": "wizard", "content": "x"}]}, None, 400, ("role",)),
    ("missing-role", {"messages": [{"content": "x"}]}, None, 400, ("role",)),
    ("role-int", {"messages": [{"role": 7, "content": "x"}]}, None, 400, ("role",)),
    ("content-int", {"messages": [{"role": "user", "content": 5}]}, None, 400, ("content must be a string",)),
    ("content-dict", {"messages": [{"role": "user", "content": {"text": "x"}}]}, None, 400, ("content must be",)),
    ("part-not-object", {"messages": [{"role": "user", "content": [1, "x"]}]}, None, 400, ("with a 'type'",)),
    ("part-no-type", {"messages": [{"role": "user", "content": [{"text": "x"}]}]}, None, 400, ("with a 'type'",)),
    ("part-text-int", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, None, 400,
     ("text must be a string",)),
    ("part-image", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     None, 400, ("text parts",)),
    ("tool-calls-not-list", {"messages": [{"role": "assistant", "content": "", "tool_calls": "f()"}]}, None, 400,
     ("tool_calls must be a list",)),
    ("tool-call-not-dict", {"messages": [{"role": "assistant", "content": "", "tool_calls": ["f", 1]}]}, None, 400,
     ("function.name",)),
    ("tool-call-name-int", {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 5}}]}]}, None,
     400, ("function.name",)),
    ("tool-call-bad-json-args", {"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{bad"}}]}]}, None, 400,
     ("not valid json",)),
    ("tool-call-deep-args", {"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "1", "type": "function", "function": DEEP_ARGS}]}]}, None, 400, ("nested too deeply", "pars")),
    ("tools-not-list", {"messages": USER, "tools": "search"}, None, 400, ("tools",)),
    ("tool-not-function", {"messages": USER, "tools": [{"type": "retrieval"}]}, None, 400, ("tools[0]",)),
    ("tool-int", {"messages": USER, "tools": [5]}, None, 400, ("tools[0]",)),
    ("n-zero", {"messages": USER, "n": 0}, None, 400, ("n:",)),
    ("n-negative", {"messages": USER, "n": -1}, None, 400, ("n:",)),
    ("n-huge", {"messages": USER, "n": 10**9}, None, 400, ("n:",)),
    ("n-float", {"messages": USER, "n": 1.5}, None, 400, ("n:",)),
    ("stream-n-2", {"messages": USER, "n": 2, "stream": True}, None, 400, ("stream with n > 1",)),
    ("max-tokens-negative", {"messages": USER, "max_tokens": -5}, None, 400, ("max_tokens",)),
    ("max-tokens-zero", {"messages": USER, "max_tokens": 0}, None, 400, ("max_tokens",)),
    ("max-completion-tokens-negative", {"messages": USER, "max_completion_tokens": -1}, None, 400,
     ("max_completion_tokens",)),
    ("max-tokens-huge", {"messages": USER, "max_tokens": 10**7}, None, 400, ("context",)),
    ("max-tokens-5000-digits", _raw('{"messages": [{"role": "user", "content": "x"}], "max_tokens": ' + HUGE_INT + "}"),
     None, 400, ("pars", "max_tokens", "digits")),
    ("temperature-string", {"messages": USER, "temperature": "hot"}, None, 400, ("temperature",)),
    ("temperature-nan", _raw('{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}'), None, 400,
     ("temperature",)),
    ("temperature-infinity", _raw('{"messages": [{"role": "user", "content": "x"}], "temperature": Infinity}'), None,
     400, ("temperature",)),
    ("temperature-negative", {"messages": USER, "temperature": -1}, None, 400, ("temperature",)),
    ("top-p-zero", {"messages": USER, "top_p": 0}, None, 400, ("top_p",)),
    ("top-p-nan", _raw('{"messages": [{"role": "user", "content": "x"}], "top_p": NaN}'), None, 400, ("top_p",)),
    ("top-k-negative", {"messages": USER, "top_k": -1}, None, 400, ("top_k",)),
    ("seed-string", {"messages": USER, "seed": "x"}, None, 400, ("seed",)),
    ("stop-five", {"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, None, 400, ("stop",)),
    ("stop-empty-string", {"messages": USER, "stop": [""]}, None, 400, ("stop",)),
    ("stop-int", {"messages": USER, "stop": [1]}, None, 400, ("stop",)),
    ("top-logprobs-21", {"messages": USER, "logprobs": True, "top_logprobs": 21}, None, 400, ("top_logprobs",)),
    ("top-logprobs-no-logprobs", {"messages": USER, "top_logprobs": 3}, None, 400, ("requires logprobs",)),
    ("presence-penalty-nan", _raw('{"messages": [{"role": "user", "content": "x"}], "presence_penalty": NaN}'), None,
     400, ("not supported",)),
    ("frequency-penalty", {"messages": USER, "frequency_penalty": -2}, None, 400, ("not supported",)),
    ("logit-bias", {"messages": USER, "logit_bias": {"50256": -100}}, None, 400, ("logit_bias",)),
    ("response-format-json", {"messages": USER, "response_format": {"type": "json_object"}}, None, 400,
     ("response_format",)),
    ("model-too-long", {"messages": USER, "model": "m" * 300}, None, 400, ("model",)),
    ("agent-header-too-long", {"messages": USER}, {"X-Agent-Name": "a" * 300}, 400, ("agent name",)),
    ("lone-surrogate-content", _raw('{"messages": [{"role": "user", "content": "a\\ud800b"}]}'), None, 400,
     ("not valid unicode",)),
    ("lone-surrogate-stream", _raw('{"messages": [{"role": "user", "content": "\\udfff"}], "stream": true}'), None,
     400, ("not valid unicode",)),
    ("lone-surrogate-tool", _raw('{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", '
                                 '"function": {"name": "f\\ud800"}}]}'), None, 400, ("not valid unicode",)),
    ("lone-surrogate-model", _raw('{"messages": [{"role": "user", "content": "x"}], "model": "\\ud800"}'), None, 400,
     ("model",)),
    ("10k-messages", {"messages": [{"role": "user", "content": "x"}] * 10_000}, None, 400, ("at most 2048 messages",)),
    ("2k-messages-over-context", {"messages": [{"role": "user", "content": "hello there"}] * 2000}, None, 400,
     ("context",)),
    ("1MB-content-under-body-limit", {"messages": [{"role": "user", "content": "a " * 500_000}]}, None, 400,
     ("context",)),
    ("3MB-content-over-body-limit", {"messages": [{"role": "user", "content": "a" * 3_000_000}]}, None, 413,
     ("exceeds the limit",)),
    ("deeply-nested-body", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None, 400, ("pars", "json")),
]


@pytest.fixture
def fresh(api: Api) -> dict[str, Any]:
    return api.begin(client_id="fuzz-nasty")


@pytest.mark.parametrize(("body", "headers", "status", "fragments"), [c[1:] for c in CHAT_NASTY],
                         ids=[c[0] for c in CHAT_NASTY])
def test_nasty_chat(api: Api, fresh: dict[str, Any], body: Any, headers: dict[str, str] | None, status: int,
                    fragments: tuple[str, ...]) -> None:
    h = {"Content-Type": "application/json", **(headers or {})}
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = api.request("POST", CHAT, raw=raw, token=fresh["api_key"], headers=h, group="nasty:chat")
    expect(r, status, *fragments)
    ep = episode(api, fresh["episode_id"])
    assert ep.calls == [] and ep.is_open, "a refused call was recorded"
    # the episode still works afterwards
    api.chat_ok(fresh)
    assert len(ep.calls) == 1


def test_nasty_chunked_body_over_the_limit(api: Api, fresh: dict[str, Any]) -> None:
    """No Content-Length: the limit is enforced while the body streams in."""
    def chunks():  # noqa: ANN202
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(30):
            yield b"a" * 100_000
        yield b'"}]}'

    r = api.request("POST", CHAT, raw=chunks(), token=fresh["api_key"], headers={"Content-Type": "application/json"},
                    group="nasty:chat")
    expect(r, 413, "exceeds the limit")
    assert episode(api, fresh["episode_id"]).calls == []


def test_nasty_huge_stop_and_tools_just_under_the_limit(api: Api, fresh: dict[str, Any]) -> None:
    tools = [{"type": "function", "function": {"name": f"f{i}", "description": "d" * 1000}} for i in range(1500)]
    r = api.post(CHAT, {"messages": USER, "tools": tools}, token=fresh["api_key"], group="nasty:chat")
    assert len(r.request.content) < MAX_BODY
    expect(r, 400, "context")


# ----------------------------------------------------------------------------------------------- keys
@pytest.mark.parametrize(("auth", "fragment"), [
    (None, "missing episode key"), ("Bearer", "missing episode key"), ("Bearer\tx", "missing episode key"),
    ("Basic dXNlcjpwYXNz", "missing episode key"), ("Bearer aj-ep-guess", "unknown"),
    ("Bearer aj-ep-" + "A" * 43, "unknown"), (f"Bearer {SWARM_TOKEN}", "unknown"), (f"Bearer {ADMIN_TOKEN}", "unknown"),
    ("Bearer ep-00000000000000000000000000000000", "unknown"),
])
def test_nasty_chat_without_a_valid_key(api: Api, fresh: dict[str, Any], auth: str | None, fragment: str) -> None:
    r = api.post(CHAT, {"messages": USER}, headers={"Authorization": auth} if auth else None, group="nasty:keys")
    expect(r, 401, fragment)
    assert episode(api, fresh["episode_id"]).calls == []


def test_nasty_latin1_bytes_in_the_key(api: Api) -> None:
    r = api.request("POST", CHAT, json_body={"messages": USER},
                    headers={"Authorization": "Bearer aj-ep-\xe9\xff".encode("latin-1"),
                             "X-Agent-Name": "\xe9t\xe9".encode("latin-1")}, group="nasty:keys")
    expect(r, 401, "unknown")


def test_nasty_control_bytes_in_a_header_are_refused_by_the_http_parser(api: Api) -> None:
    """Not valid HTTP. With httptools, uvicorn's parser answers 400 (plain text, before the app sees the request)
    and closes the connection: a known exception to the OpenAI error shape. With the h11 parser the request
    reaches the app, which refuses the key with an OpenAI-shaped 401. Either way the server is unaffected."""
    h = {"Authorization": "Bearer aj-ep-\x01\x7f".encode("latin-1"), "Content-Type": "application/json"}
    r = api.http.post(CHAT, content=json.dumps({"messages": USER}).encode(), headers=h)
    api.counts["nasty:keys"] += 1
    if r.status_code == 401:
        assert set(r.json()["error"]) >= {"message", "type", "param", "code"}, r.text
    else:
        assert r.status_code == 400 and r.headers.get("connection") == "close", r.text
    api.healthy()


def test_nasty_another_episodes_key(api: Api) -> None:
    a, b = api.begin(client_id="fuzz-nasty"), api.begin(client_id="fuzz-nasty")
    api.chat_ok(a)
    for action, body in (("heartbeat", None), ("end", {"reward": 1.0}), ("abort", {"reason": "x"})):
        r = api.post(f"/swarm/v1/episodes/{a['episode_id']}/{action}", body, token=b["api_key"], group="nasty:keys")
        expect(r, 403, "another episode")
    ea, eb = episode(api, a["episode_id"]), episode(api, b["episode_id"])
    assert ea.is_open and eb.is_open and len(ea.calls) == 1
    assert api.server.store.get_episode(a["episode_id"]) is None


def test_nasty_keys_of_closed_episodes(api: Api) -> None:
    ended, aborted = api.begin(client_id="fuzz-nasty"), api.begin(client_id="fuzz-nasty")
    api.chat_ok(ended)
    assert api.post(f"/swarm/v1/episodes/{ended['episode_id']}/end", {"reward": 0.5}, token=ended["api_key"],
                    group="nasty:keys").status_code == 200
    assert api.post(f"/swarm/v1/episodes/{aborted['episode_id']}/abort", {}, token=aborted["api_key"],
                    group="nasty:keys").status_code == 200
    for ep in (ended, aborted):
        expect(api.post(CHAT, {"messages": USER}, token=ep["api_key"], group="nasty:keys"), 401,
               "no longer accepts calls")
        expect(api.post(f"/swarm/v1/episodes/{ep['episode_id']}/heartbeat", token=ep["api_key"], group="nasty:keys"),
               409, "ended" if ep is ended else "aborted")
    expect(api.post(f"/swarm/v1/episodes/{aborted['episode_id']}/end", {"reward": 1.0}, token=aborted["api_key"],
                    group="nasty:keys"), 409, "aborted")
    expect(api.post(f"/swarm/v1/episodes/{ended['episode_id']}/abort", {}, token=ended["api_key"],
                    group="nasty:keys"), 409, "already ended")
    # a retried end with another reward is a duplicate: the stored reward does not change
    r = api.post(f"/swarm/v1/episodes/{ended['episode_id']}/end", {"reward": -3.0}, token=ended["api_key"],
                 group="nasty:keys")
    assert r.status_code == 200 and r.json()["duplicate"] is True
    assert api.server.store.get_episode(ended["episode_id"]).reward == 0.5
    assert api.server.store.get_episode(aborted["episode_id"]) is None


def test_nasty_expired_key(make_server, fuzz_counts, fuzz_statuses) -> None:  # noqa: ANN001
    from tests.conftest import wait_until

    api = Api(make_server(swarm_token=SWARM_TOKEN, admin_token=ADMIN_TOKEN, lease_seconds=0.5), fuzz_counts,
              fuzz_statuses)
    try:
        ep = api.begin(client_id="fuzz-expiry")
        api.chat_ok(ep)
        wait_until(lambda: episode(api, ep["episode_id"]).status is EpisodeStatus.EXPIRED, timeout=20)
        expect(api.post(CHAT, {"messages": USER}, token=ep["api_key"], group="nasty:keys"), 401, "expired")
        expect(api.post(f"/swarm/v1/episodes/{ep['episode_id']}/heartbeat", token=ep["api_key"], group="nasty:keys"),
               409, "expired")
        expect(api.post(f"/swarm/v1/episodes/{ep['episode_id']}/end", {"reward": 1.0}, token=ep["api_key"],
                        group="nasty:keys"), 409, "expired")
        assert api.server.store.get_episode(ep["episode_id"]) is None
        api.healthy()
    finally:
        api.close()


# ---------------------------------------------------------------------------------------------- rewards
END_NASTY = [
    ("reward-nan", b'{"reward": NaN}', 400, ("finite",)),
    ("reward-infinity", b'{"reward": Infinity}', 400, ("finite",)),
    ("reward-minus-infinity", b'{"reward": -Infinity}', 400, ("finite",)),
    ("reward-overflow-literal", b'{"reward": 1e999}', 400, ("finite",)),
    ("reward-dict-nan", b'{"reward": {"default": NaN}}', 400, ("finite",)),
    ("reward-near-float-max", b'{"reward": 1.7e308}', 400, ("between",)),
    ("reward-minus-1e10", b'{"reward": -1e10}', 400, ("between",)),
    ("reward-dict-huge", b'{"reward": {"default": 1e300}}', 400, ("between",)),
    ("reward-5000-digits", _raw('{"reward": ' + HUGE_INT + "}"), 400, ("pars", "reward", "digits")),
    ("reward-string", b'{"reward": "high"}', 400, ("reward",)),
    ("reward-null", b'{"reward": null}', 400, ("reward",)),
    ("reward-list", b'{"reward": [1.0]}', 400, ("reward",)),
    ("reward-empty-dict", b'{"reward": {}}', 400, ("empty",)),
    ("reward-unknown-agent", b'{"reward": {"someone-else": 1.0}}', 400, ("per-agent reward",)),
    ("reward-missing", b"{}", 400, ("reward",)),
    ("extra-field", b'{"reward": 1.0, "bonus": 2}', 400, ("bonus", "extra")),
    ("metadata-list", b'{"reward": 1.0, "metadata": [1, 2]}', 400, ("metadata",)),
    ("malformed-json", b'{"reward": 1.0', 400, ("json",)),
    ("empty-body", b"", 400, ("required",)),
    ("deeply-nested-metadata", b'{"reward": 1.0, "metadata": {"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}", 400,
     ("pars", "json")),
    ("metadata-over-body-limit", b'{"reward": 1.0, "metadata": {"a": "' + b"x" * 3_000_000 + b'"}}', 413,
     ("exceeds the limit",)),
]


@pytest.mark.parametrize(("raw", "status", "fragments"), [c[1:] for c in END_NASTY], ids=[c[0] for c in END_NASTY])
def test_nasty_end(api: Api, fresh: dict[str, Any], raw: bytes, status: int, fragments: tuple[str, ...]) -> None:
    api.chat_ok(fresh)
    path = f"/swarm/v1/episodes/{fresh['episode_id']}/end"
    r = api.request("POST", path, raw=raw, token=fresh["api_key"], headers={"Content-Type": "application/json"},
                    group="nasty:end")
    expect(r, status, *fragments)
    ep = episode(api, fresh["episode_id"])
    assert ep.is_open and len(ep.calls) == 1, "a refused end changed the episode"
    assert api.server.store.get_episode(fresh["episode_id"]) is None, "a refused end was stored"
    r = api.post(path, {"reward": 1.0}, token=fresh["api_key"], group="nasty:end")  # a good end still works
    assert r.status_code == 200 and r.json()["samples"] == 1


def test_nasty_end_wrong_content_type(api: Api, fresh: dict[str, Any]) -> None:
    r = api.request("POST", f"/swarm/v1/episodes/{fresh['episode_id']}/end", raw=b'{"reward": 1.0}',
                    token=fresh["api_key"], headers={"Content-Type": "text/plain"}, group="nasty:end")
    expect(r, 400, "dictionary", "object")
    assert episode(api, fresh["episode_id"]).is_open


# --------------------------------------------------------------------------------------- tokens, control
def test_nasty_begin_and_join_without_the_swarm_token(api: Api) -> None:
    before = snapshot(api)
    for auth in (None, "Bearer wrong", f"Bearer {ADMIN_TOKEN}", f"Bearer {SWARM_TOKEN[:-1]}", f"Basic {SWARM_TOKEN}",
                 f"Bearer {SWARM_TOKEN}x"):
        h = {"Authorization": auth} if auth else None
        expect(api.post("/swarm/v1/episodes", {"client_id": "c", "task_id": "t"}, headers=h, group="nasty:tokens"),
               401, "swarm token")
        expect(api.post("/swarm/v1/join", {"client_id": "c"}, headers=h, group="nasty:tokens"), 401, "swarm token")
    assert snapshot(api) == before


def test_nasty_status_needs_a_token(api: Api, fresh: dict[str, Any]) -> None:
    for token in (None, "wrong", fresh["api_key"]):
        expect(api.get("/swarm/v1/status", token=token, group="nasty:tokens"), 401, "swarm token or the admin token")
    assert api.get("/swarm/v1/status", token=SWARM_TOKEN, group="nasty:tokens").status_code == 200
    assert api.get("/swarm/v1/status", token=ADMIN_TOKEN, group="nasty:tokens").status_code == 200


@pytest.mark.parametrize(("method", "path"), CONTROL, ids=[f"{m}-{p}" for m, p in CONTROL])
def test_nasty_control_without_the_admin_token(api: Api, fresh: dict[str, Any], method: str, path: str) -> None:
    before = snapshot(api)
    for auth in (None, "Bearer", "Bearer wrong", f"Bearer {SWARM_TOKEN}", f"Bearer {fresh['api_key']}",
                 f"Basic {ADMIN_TOKEN}", f"Bearer {ADMIN_TOKEN[:-1]}", f"Bearer {ADMIN_TOKEN.upper()}"):
        r = api.request(method, f"/swarm/v1/control/{path}", json_body={} if method == "POST" else None,
                        headers={"Authorization": auth} if auth else None, group="nasty:control")
        expect(r, 401, "admin token")
    assert snapshot(api) == before
    assert not (api.server.config.data_dir / "checkpoints").exists()


@pytest.mark.parametrize(("body", "fragment"), [
    ({"training": {"group_size": 0}}, "group_size"),
    ({"training": {"group_size": 4, "min_group_size": 99}}, "min_group_size"),
    ({"training": {"no_such_setting": 1}}, "no_such_setting"),
    ({"training": {"learning_rate": 1e-4}}, "training.learning_rate moved to learner.learning_rate"),
    ({"learner": {"learning_rate": "fast"}}, "learning_rate"),
    ({"learner": {"weight_decay": 0.1}}, "learner.weight_decay cannot change while the server runs"),
    ({"training": {"estimator": "ppo"}}, "estimator"),
    ({"sampling": {"temperature": float("nan")}}, "temperature"),
    ({"sampling": {"top_p": float("inf")}}, "top_p"),
    ({"sampling": {"max_tokens": -1}}, "max_tokens"),
    ({"training": {"group_size": 2}, "sampling": {"temperature": 99}}, "temperature"),  # all or nothing
    ({"training": []}, "training"),
    ({"other": {}}, "other"),
])
def test_nasty_config_change_is_all_or_nothing(control_api: Api, body: dict[str, Any], fragment: str) -> None:
    before = snapshot(control_api)
    expect(control_api.post("/swarm/v1/control/config", body, token=ADMIN_TOKEN, group="nasty:control"), 400, fragment)
    assert snapshot(control_api) == before


# --------------------------------------------------------------------------------------------------- ids
ODD_IDS = ["%00", "ep-%00", "%C3%A9", "%F0%9F%A6%80", "%E2%80%AE", "..", "...", "%2E%2E", "..%2F..%2Fcontrol%2Fstop",
           "%2F", "ep-" + "0" * 32, "a" * 4000, "%ED%A0%80", "%FF", "ep-1;drop table episodes", "*", "%20"]


@pytest.mark.parametrize("odd", ODD_IDS, ids=[f"id{i}" for i in range(len(ODD_IDS))])
@pytest.mark.parametrize("action", ["heartbeat", "end", "abort"])
def test_nasty_episode_ids(api: Api, fresh: dict[str, Any], odd: str, action: str) -> None:
    before = snapshot(api)
    for token in (fresh["api_key"], ADMIN_TOKEN, None):
        body = {"reward": 1.0} if action == "end" else None
        r = api.post(f"/swarm/v1/episodes/{odd}/{action}", body, token=token, group="nasty:ids")
        if r.status_code != 404:  # a path that does not match a route at all
            if token == fresh["api_key"]:
                expect(r, 403, "another episode")
            else:
                expect(r, 401, "episode key")
    assert snapshot(api) == before
    assert episode(api, fresh["episode_id"]).is_open


def _raw_http(api: Api, request_line: str, token: str) -> tuple[int, bytes]:
    """Send a request line as is (httpx would normalise ``..`` segments away)."""
    host, port = api.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"{request_line} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
                  "Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    api.counts["nasty:ids"] += 1
    status = int(data.split(b" ", 2)[1])
    assert status < 500, data[:500]
    body = data.split(b"\r\n\r\n", 1)[1]
    if status >= 400:
        err = json.loads(body)["error"]
        assert err["message"] and {"type", "param", "code"} <= set(err)
    return status, body


@pytest.mark.parametrize("target", [
    "POST /swarm/v1/episodes/../control/pause", "POST /swarm/v1/episodes/../../v1/control/stop",
    "POST /swarm/v1/episodes/x/../../control/stop", "POST /v1/../swarm/v1/control/pause",
    "GET /swarm/v1/episodes/../status", "POST //swarm/v1/control/pause", "POST /swarm/v1/control/pause/..",
])
def test_nasty_path_traversal(api: Api, fresh: dict[str, Any], target: str) -> None:
    before = snapshot(api)
    for token in (fresh["api_key"], SWARM_TOKEN):
        status, _ = _raw_http(api, target, token)
        assert status in (401, 404, 405), (target, status)
    assert snapshot(api) == before
    api.healthy()


def test_nasty_odd_ids_in_begin(api: Api) -> None:
    before = snapshot(api)
    for field in ("client_id", "task_id", "group_id", "task_type"):
        for odd in ("", "a\x00b", "é", "🦀", "a b", "x" * 201, "a\nb", "\ud800", 5, None, ["x"]):
            body = {"client_id": "c", "task_id": "t", field: odd}
            if odd is None and field in ("group_id",):
                continue  # group_id may be null
            expect(api.post("/swarm/v1/episodes", body, token=SWARM_TOKEN, group="nasty:ids"), 400, field)
    assert snapshot(api) == before


def test_server_still_healthy_at_the_end(api: Api) -> None:
    time.sleep(0.2)
    api.healthy()
    ep = api.begin(client_id="fuzz-final")
    api.chat_ok(ep)
    r = api.post(f"/swarm/v1/episodes/{ep['episode_id']}/end", {"reward": 1.0}, token=ep["api_key"], group="setup")
    assert r.status_code == 200
    assert api.server.registry.counts["begun"] > 0


# ---------------------------------------------------------------------- concurrent hostile sampling parameters
HUGE_INTS = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([2**63, 2**64, -1, 0]))
ODD_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e30, -0.0, 1e-320]))
HOSTILE_PARAMS = st.dictionaries(
    st.sampled_from(["seed", "top_k", "temperature", "top_p", "max_tokens", "n", "top_logprobs", "stop"]),
    st.one_of(HUGE_INTS, ODD_FLOATS, st.booleans(), st.text(max_size=5), st.lists(st.text(max_size=3), max_size=5)),
    min_size=1, max_size=3)


@pytest.fixture(scope="module")
def engine_api(fuzz_server_factory: Any, tiny_model_path: Any) -> Api:
    """A server with the real, batching tiny engine: hostile and normal calls share its batches."""
    from agentjet.layouts import embedded_engine
    from agentjet.settings import GeneratorSettings

    return fuzz_server_factory(engine=embedded_engine(tiny_model_path,
                                                      GeneratorSettings(max_batch_size=8, batch_wait_ms=20)))


@settings(FUZZ, max_examples=max(10, examples() // 2))  # three calls through the real engine per example
@given(params=HOSTILE_PARAMS)
def test_fuzz_hostile_sampling_never_fails_a_concurrent_normal_call(engine_api: Api, params: dict[str, Any]) -> None:
    """Invariant 4 under fuzzing: a hostile call shares an engine batch with two normal ones; the normal ones
    always succeed, and the hostile one gets a 2xx or a 4xx that names one of its own fields."""
    from concurrent.futures import ThreadPoolExecutor

    good_ep, bad_ep = engine_api.begin("good"), engine_api.begin("evil")
    normal = {"messages": USER, "max_tokens": 4}
    hostile = {"messages": USER, "max_tokens": 4, **params}
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(engine_api.post, CHAT, normal, token=good_ep["api_key"], group="hypothesis:concurrent-normal")
                   for _ in range(2)]
        futures.append(pool.submit(engine_api.post, CHAT, hostile, token=bad_ep["api_key"], group="hypothesis:concurrent-hostile"))
        *goods, bad = [f.result() for f in futures]
    assert all(r.status_code == 200 for r in goods), [r.text for r in goods]
    if bad.status_code >= 400:
        param = bad.json()["error"]["param"] or ""
        assert any(name in param for name in (*params, "max_tokens")), (params, bad.json())
