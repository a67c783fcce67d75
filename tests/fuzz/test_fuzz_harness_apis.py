"""Fuzzing the harness APIs (``/v1/responses``, ``/v1/messages``, ``/v1/messages/count_tokens``,
``/v1/completions``) of a real swarm server, like the chat route (test_fuzz_api.py): random and mutated bodies,
raw bytes and content types, and a hand-written list of nasty inputs. Every answer is < 500; every error is in
the shape of the API asked (OpenAI's, or Anthropic's on the Messages routes); a refused call records nothing; an
accepted one records exactly one call (count_tokens none). And a malformed request on one API never fails
another client's call through another API in the same engine batch."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .conftest import Api, assert_error_shape, examples
from .test_fuzz_api import FUZZ, JSON, TEXT, VTEXT, blend, episode, maybe

RESPONSES, MESSAGES, COUNT, COMPLETIONS = "/v1/responses", "/v1/messages", "/v1/messages/count_tokens", "/v1/completions"
GENERATING = (RESPONSES, MESSAGES, COMPLETIONS)


def assert_anthropic_error_shape(r: httpx.Response) -> dict[str, Any]:
    """Anthropic's error shape: ``{"type": "error", "error": {"type", "message"}}`` with a real message."""
    assert r.headers.get("content-type", "").startswith("application/json"), (r.status_code, r.text[:300])
    body = r.json()
    assert isinstance(body, dict) and body.get("type") == "error" and set(body) == {"type", "error"}, body
    err = body["error"]
    assert isinstance(err, dict) and isinstance(err.get("type"), str) and err["type"], err
    assert isinstance(err.get("message"), str) and len(err["message"].strip()) >= 8, err
    return err


class HarnessApi(Api):
    """Checks each error in the shape of the API it was asked through."""

    def check_error(self, r: httpx.Response) -> dict[str, Any]:  # type: ignore[override]
        if r.request.url.path.startswith(MESSAGES):
            return assert_anthropic_error_shape(r)
        return assert_error_shape(r)


@pytest.fixture(scope="module")
def hapi(api: Api) -> HarnessApi:
    return HarnessApi(api.bg, api.counts, api.statuses)


@pytest.fixture(scope="module")
def hep(hapi: HarnessApi) -> dict[str, Any]:
    return hapi.begin(client_id="fuzz-harness")


# ============================================================================================ strategies
VPARTS = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text"]), "text": VTEXT}),
                  max_size=2)
VITEM = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "developer"]),
                           "content": st.one_of(VTEXT, VPARTS)}, optional={"type": st.just("message")}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": VTEXT, "name": VTEXT,
                           "arguments": st.sampled_from(["{}", '{"x": 1}', ""])}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": VTEXT, "output": VTEXT}),
    st.fixed_dictionaries({"type": st.just("reasoning"), "summary": st.just([])}))
VRTOOL = st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "name": VTEXT},
                          optional={"description": VTEXT, "parameters": st.just({"type": "object", "properties": {}})}),
    st.fixed_dictionaries({"type": st.just("custom"), "name": VTEXT}))
VALID_RESPONSES = st.fixed_dictionaries(
    {"input": st.one_of(VTEXT, st.lists(VITEM, min_size=1, max_size=4))},
    optional={"model": st.text(max_size=20), "instructions": VTEXT, "tools": st.lists(VRTOOL, max_size=2),
              "tool_choice": st.sampled_from(["auto", "none"]), "parallel_tool_calls": st.booleans(),
              "max_output_tokens": st.integers(1, 64), "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1),
              "stream": st.booleans(), "store": st.booleans(), "include": st.just(["reasoning.encrypted_content"]),
              "reasoning": st.just({"effort": "low"}), "prompt_cache_key": VTEXT, "client_metadata": st.just({}),
              "metadata": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
              "text": st.just({"format": {"type": "text"}}), "top_logprobs": st.integers(0, 5)})
JUNKY_RESPONSES = maybe(st.fixed_dictionaries(
    {"input": maybe(st.one_of(TEXT, st.lists(maybe(VITEM), max_size=4)), 8)},
    optional={"instructions": JSON, "tools": maybe(st.lists(maybe(VRTOOL), max_size=2)), "tool_choice": JSON,
              "max_output_tokens": maybe(st.integers(-2, 10**7)), "temperature": maybe(st.floats(allow_nan=True)),
              "stream": JSON, "store": JSON, "previous_response_id": maybe(TEXT), "text": JSON, "include": JSON,
              "conversation": JSON, "background": JSON, "stop": JSON, "seed": maybe(st.integers())}), 10)

VBLOCK = st.fixed_dictionaries({"type": st.just("text"), "text": VTEXT},
                               optional={"cache_control": st.just({"type": "ephemeral"})})
VMSG = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.one_of(VTEXT, st.lists(
        VBLOCK, max_size=2))}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.lists(st.one_of(VBLOCK, st.fixed_dictionaries(
        {"type": st.just("tool_use"), "id": VTEXT, "name": VTEXT, "input": st.just({"x": 1})})), min_size=1,
        max_size=2)}),
    st.fixed_dictionaries({"role": st.just("user"), "content": st.lists(st.fixed_dictionaries(
        {"type": st.just("tool_result"), "tool_use_id": VTEXT, "content": st.one_of(VTEXT, st.lists(VBLOCK, max_size=1))}),
        min_size=1, max_size=2)}),
    st.fixed_dictionaries({"role": st.just("system"), "content": VTEXT}))
VMTOOL = st.fixed_dictionaries({"name": VTEXT}, optional={"description": VTEXT, "input_schema": st.just(
    {"type": "object", "properties": {}})})
MESSAGES_FIELDS = {"model": st.text(max_size=20), "system": st.one_of(VTEXT, st.lists(VBLOCK, max_size=3)),
                   "tools": st.lists(VMTOOL, max_size=2),
                   "tool_choice": st.sampled_from([{"type": "auto"}, {"type": "none"}, {"type": "any"}]),
                   "thinking": st.just({"type": "adaptive"}), "metadata": st.just({"user_id": "u"}),
                   "context_management": st.just({}), "output_config": st.just({})}
VALID_MESSAGES = st.fixed_dictionaries(
    {"messages": st.lists(VMSG, min_size=1, max_size=4), "max_tokens": st.integers(1, 40000)},
    optional={**MESSAGES_FIELDS, "stop_sequences": st.lists(st.text(min_size=1, max_size=4), max_size=3),
              "temperature": st.floats(0, 1), "top_p": st.floats(0.01, 1), "top_k": st.integers(0, 40),
              "stream": st.booleans()})
VALID_COUNT = st.fixed_dictionaries({"messages": st.lists(VMSG, min_size=1, max_size=4)}, optional=MESSAGES_FIELDS)
JUNKY_MESSAGES = maybe(st.fixed_dictionaries(
    {"messages": maybe(st.lists(maybe(VMSG), max_size=4), 8), "max_tokens": maybe(st.integers(-2, 10**9))},
    optional={"system": JSON, "tools": maybe(st.lists(maybe(VMTOOL), max_size=2)), "tool_choice": JSON,
              "stop_sequences": JSON, "temperature": maybe(st.floats(allow_nan=True)), "top_k": JSON, "stream": JSON,
              "mcp_servers": JSON}), 10)

VALID_COMPLETIONS = st.fixed_dictionaries(
    {"prompt": st.one_of(st.text(min_size=1, max_size=30), st.lists(st.integers(0, 500), min_size=1, max_size=8))},
    optional={"model": st.text(max_size=20), "max_tokens": st.integers(1, 32), "temperature": st.floats(0, 2),
              "top_p": st.floats(0.01, 1), "top_k": st.integers(0, 40), "seed": st.integers(0, 2**40),
              "n": st.integers(1, 3), "logprobs": st.integers(0, 5), "echo": st.booleans(), "stream": st.booleans(),
              "stop": st.lists(st.text(min_size=1, max_size=4), max_size=3)})
JUNKY_COMPLETIONS = maybe(st.fixed_dictionaries(
    {"prompt": maybe(st.one_of(TEXT, st.lists(st.one_of(st.integers(-5, 10**6), TEXT), max_size=4)), 8)},
    optional={"max_tokens": maybe(st.integers(-2, 10**7)), "n": maybe(st.integers(-1, 20)), "logprobs": JSON,
              "echo": JSON, "stream": JSON, "suffix": JSON, "best_of": JSON, "stop": JSON}), 10)

BODIES = {RESPONSES: blend(VALID_RESPONSES, JUNKY_RESPONSES), MESSAGES: blend(VALID_MESSAGES, JUNKY_MESSAGES),
          COUNT: blend(VALID_COUNT, JUNKY_MESSAGES), COMPLETIONS: blend(VALID_COMPLETIONS, JUNKY_COMPLETIONS)}
TERMINAL = {RESPONSES: ("response.completed", "response.incomplete", "response.failed"),
            MESSAGES: ("message_stop",), COMPLETIONS: ("[DONE]",)}


def last_event(text: str) -> str:
    """The name of a stream's last event (``event:`` lines; ``[DONE]`` for OpenAI's chunk streams)."""
    lines = [line for line in text.splitlines() if line.startswith(("event: ", "data: [DONE]"))]
    return lines[-1].removeprefix("event: ").removeprefix("data: ") if lines else ""


def _auth(path: str, key: str, how: str) -> dict[str, str]:
    if path.startswith(MESSAGES) and how == "x-api-key":
        return {"x-api-key": key}
    return {"Authorization": f"Bearer {key}"}


# ============================================================================================ property-based
@pytest.mark.parametrize("path", list(BODIES))
@FUZZ
@given(data=st.data(), how=st.sampled_from(["bearer", "x-api-key"]))
def test_fuzz_harness_routes(hapi: HarnessApi, hep: dict[str, Any], path: str, data: st.DataObject, how: str) -> None:
    body = data.draw(BODIES[path], label="body")
    ep = episode(hapi, hep["episode_id"])
    before = len(ep.calls)
    r = hapi.post(path, body, headers=_auth(path, hep["api_key"], how), group=f"hypothesis:{path}")
    if r.status_code == 200 and path == COUNT:
        assert isinstance(r.json()["input_tokens"], int) and len(ep.calls) == before
    elif r.status_code == 200:
        if isinstance(body, dict) and body.get("stream") is True:
            assert last_event(r.text) in TERMINAL[path], r.text[-800:]
        else:
            n = body.get("n", 1) if path == COMPLETIONS else 1
            assert len(ep.calls) == before + n
            assert r.json()["object" if path != MESSAGES else "type"] in ("response", "message", "text_completion")
    else:
        assert 400 <= r.status_code < 500
        assert len(ep.calls) == before, "a refused call was recorded"
    assert ep.is_open
    if len(ep.calls) > 200:
        ep.calls.clear()
        ep.stored.clear()


RAW = st.one_of(st.binary(max_size=200), TEXT.map(lambda s: s.encode("utf-8", "surrogatepass")),
                JSON.map(lambda v: json.dumps(v, allow_nan=True)[:-1].encode()),
                st.sampled_from([b"", b"{", b"[" * 5000, b"\xff\xfe{}", b'{"a":1}{"b":2}', b"null",
                                 b'{"input": "x", "max_output_tokens": 1e99999}']))
CONTENT_TYPE = st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", "",
                                "multipart/form-data; boundary=x", "application/octet-stream"])


@FUZZ
@given(path=st.sampled_from(list(BODIES)), raw=RAW, ctype=CONTENT_TYPE)
def test_fuzz_harness_raw_bodies(hapi: HarnessApi, hep: dict[str, Any], path: str, raw: bytes, ctype: str) -> None:
    ep = episode(hapi, hep["episode_id"])
    before = len(ep.calls)
    r = hapi.request("POST", path, raw=raw, headers={**_auth(path, hep["api_key"], "bearer"),
                                                     **({"Content-Type": ctype} if ctype else {})},
                     group="hypothesis:harness-raw")
    if r.status_code != 200:
        assert len(ep.calls) == before


@FUZZ
@given(path=st.sampled_from(list(BODIES)), key=st.one_of(st.none(), st.just(""), st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40)),
       how=st.sampled_from(["bearer", "x-api-key"]))
def test_fuzz_harness_keys(hapi: HarnessApi, hep: dict[str, Any], path: str, key: str | None, how: str) -> None:
    body = {RESPONSES: {"input": "hi"}, MESSAGES: {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
            COUNT: {"messages": [{"role": "user", "content": "hi"}]}, COMPLETIONS: {"prompt": "hi"}}[path]
    headers = _auth(path, key, how) if key else {}
    r = hapi.post(path, body, headers=headers, group="hypothesis:harness-keys")
    assert r.status_code == 401, r.text
    if path.startswith(MESSAGES):
        assert r.json()["error"]["type"] == "authentication_error"


# ============================================================================================ nasty inputs
HI = [{"role": "user", "content": "hi"}]
NASTY: list[tuple[str, str, Any, int, tuple[str, ...]]] = [
    ("responses-malformed", RESPONSES, b"{not json", 400, ("json",)),
    ("responses-no-input", RESPONSES, {"model": "tiny"}, 400, ("input",)),
    ("responses-input-int", RESPONSES, {"input": 5}, 400, ("input",)),
    ("responses-item-not-object", RESPONSES, {"input": [1]}, 400, ("must be an object",)),
    ("responses-bad-role", RESPONSES, {"input": [{"role": "wizard", "content": "x"}]}, 400, ("role",)),
    ("responses-image", RESPONSES, {"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, 400,
     ("text parts",)),
    ("responses-file", RESPONSES, {"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, 400,
     ("text parts",)),
    ("responses-unknown-item", RESPONSES, {"input": [{"type": "computer_call"}]}, 400, ("computer_call",)),
    ("responses-call-no-name", RESPONSES, {"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]},
     400, ("name must be a string",)),
    ("responses-call-bad-args", RESPONSES, {"input": [{"type": "function_call", "call_id": "c", "name": "f",
                                                        "arguments": "{bad"}]}, 400, ("not valid json",)),
    ("responses-web-search", RESPONSES, {"input": "x", "tools": [{"type": "web_search"}]}, 400, ("built-in",)),
    ("responses-file-search", RESPONSES, {"input": "x", "tools": [{"type": "file_search"}]}, 400, ("built-in",)),
    ("responses-tool-choice-web", RESPONSES, {"input": "x", "tool_choice": {"type": "web_search"}}, 400,
     ("tool_choice",)),
    ("responses-json-schema", RESPONSES, {"input": "x", "text": {"format": {"type": "json_schema"}}}, 400,
     ("text.format",)),
    ("responses-conversation", RESPONSES, {"input": "x", "conversation": "conv"}, 400, ("conversation",)),
    ("responses-prompt-template", RESPONSES, {"input": "x", "prompt": {"id": "p"}}, 400, ("prompt",)),
    ("responses-background", RESPONSES, {"input": "x", "background": True}, 400, ("background",)),
    ("responses-unknown-previous", RESPONSES, {"input": "x", "previous_response_id": "resp_nope"}, 404,
     ("not a stored response",)),
    ("responses-max-output-zero", RESPONSES, {"input": "x", "max_output_tokens": 0}, 400, ("max_output_tokens",)),
    ("responses-temperature-nan", RESPONSES, b'{"input": "x", "temperature": NaN}', 400, ("temperature",)),
    ("responses-over-context", RESPONSES, {"input": "hello there " * 3000}, 400, ("context",)),
    ("responses-lone-surrogate", RESPONSES, b'{"input": "a\\ud800b"}', 400, ("not valid unicode",)),
    ("responses-3MB", RESPONSES, {"input": "a" * 3_000_000}, 413, ("exceeds the limit",)),
    ("messages-malformed", MESSAGES, b"{not json", 400, ("json",)),
    ("messages-no-max-tokens", MESSAGES, {"messages": HI}, 400, ("max_tokens",)),
    ("messages-max-tokens-zero", MESSAGES, {"messages": HI, "max_tokens": 0}, 400, ("max_tokens",)),
    ("messages-no-messages", MESSAGES, {"max_tokens": 5}, 400, ("messages",)),
    ("messages-empty", MESSAGES, {"messages": [], "max_tokens": 5}, 400, ("at least one message",)),
    ("messages-bad-role", MESSAGES, {"messages": [{"role": "tool", "content": "x"}], "max_tokens": 5}, 400, ("role",)),
    ("messages-image", MESSAGES, {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
                                  "max_tokens": 5}, 400, ("images and documents",)),
    ("messages-document", MESSAGES, {"messages": [{"role": "user", "content": [{"type": "document"}]}],
                                     "max_tokens": 5}, 400, ("images and documents",)),
    ("messages-image-in-tool-result", MESSAGES, {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]}], "max_tokens": 5}, 400,
     ("images and documents",)),
    ("messages-tool-use-bad-input", MESSAGES, {"messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}], "max_tokens": 5}, 400, ("input must be",)),
    ("messages-server-tool", MESSAGES, {"messages": HI, "max_tokens": 5, "tools": [{"type": "web_search_20250305",
                                                                                   "name": "web_search"}]}, 400,
     ("anthropic's own tools",)),
    ("messages-bash-tool", MESSAGES, {"messages": HI, "max_tokens": 5, "tools": [{"type": "bash_20250124",
                                                                                 "name": "bash"}]}, 400,
     ("anthropic's own tools",)),
    ("messages-tool-choice-bad", MESSAGES, {"messages": HI, "max_tokens": 5, "tool_choice": {"type": "some"}}, 400,
     ("tool_choice",)),
    ("messages-tool-choice-unknown-tool", MESSAGES, {"messages": HI, "max_tokens": 5,
                                                     "tool_choice": {"type": "tool", "name": "nope"}}, 400,
     ("not among the tools",)),
    ("messages-mcp", MESSAGES, {"messages": HI, "max_tokens": 5, "mcp_servers": [{"url": "x"}]}, 400, ("mcp",)),
    ("messages-five-stops", MESSAGES, {"messages": HI, "max_tokens": 5, "stop_sequences": list("abcde")}, 400,
     ("stop_sequences",)),
    ("messages-temperature-2", MESSAGES, {"messages": HI, "max_tokens": 5, "temperature": 2}, 400, ("temperature",)),
    ("messages-too-long", MESSAGES, {"messages": [{"role": "user", "content": "hello there " * 3000}],
                                     "max_tokens": 5}, 400, ("prompt is too long",)),
    ("messages-3MB", MESSAGES, {"messages": [{"role": "user", "content": "a" * 3_000_000}], "max_tokens": 5}, 413,
     ("exceeds the limit",)),
    ("count-malformed", COUNT, b"[]", 400, ("dictionary", "object")),
    ("count-image", COUNT, {"messages": [{"role": "user", "content": [{"type": "image"}]}]}, 400,
     ("images and documents",)),
    ("completions-malformed", COMPLETIONS, b"{", 400, ("json",)),
    ("completions-no-prompt", COMPLETIONS, {"max_tokens": 5}, 400, ("prompt",)),
    ("completions-two-prompts", COMPLETIONS, {"prompt": ["a", "b"]}, 400, ("one request per prompt",)),
    ("completions-token-out-of-range", COMPLETIONS, {"prompt": [10**9]}, 400, ("token ids must be in",)),
    ("completions-negative-token", COMPLETIONS, {"prompt": [-1]}, 400, ("token ids must be in",)),
    ("completions-bool-tokens", COMPLETIONS, {"prompt": [True, False]}, 400, ("one request per prompt",)),
    ("completions-empty", COMPLETIONS, {"prompt": ""}, 400, ("empty",)),
    ("completions-max-tokens-huge", COMPLETIONS, {"prompt": "x", "max_tokens": 10**7}, 400, ("context",)),
    ("completions-scoring-without-echo", COMPLETIONS, {"prompt": "x", "max_tokens": 0}, 400, ("max_tokens",)),
    ("completions-lone-surrogate", COMPLETIONS, b'{"prompt": "a\\ud800b"}', 400, ("tokenized", "unicode")),
]


@pytest.mark.parametrize(("path", "body", "status", "fragments"), [c[1:] for c in NASTY], ids=[c[0] for c in NASTY])
def test_nasty_harness_inputs(hapi: HarnessApi, path: str, body: Any, status: int, fragments: tuple[str, ...]) -> None:
    ep = hapi.begin(client_id="fuzz-harness-nasty")
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = hapi.request("POST", path, raw=raw, headers={**_auth(path, ep["api_key"], "bearer"),
                                                     "Content-Type": "application/json"}, group=f"nasty:{path}")
    assert r.status_code == status, (r.status_code, r.text[:500])
    message = hapi.check_error(r)["message"].lower()
    assert any(f.lower() in message for f in fragments), (fragments, message)
    live = episode(hapi, ep["episode_id"])
    assert live.calls == [] and live.is_open, "a refused call was recorded"
    hapi.chat_ok(ep)  # the episode still works afterwards
    assert len(live.calls) == 1


# ------------------------------------------------------------------------- one API's bad call, another's batch
NORMAL = {RESPONSES: {"input": "hi", "max_output_tokens": 4},
          MESSAGES: {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
          COMPLETIONS: {"prompt": "hi", "max_tokens": 4},
          "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}
HOSTILE_VALUES = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
                           st.booleans(), st.text(max_size=5), st.lists(st.text(max_size=3), max_size=5), JSON)
HOSTILE_KEYS = {RESPONSES: ["max_output_tokens", "temperature", "top_p", "top_logprobs", "stop", "seed", "input",
                            "tools", "tool_choice", "instructions"],
                MESSAGES: ["max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "messages", "system",
                           "tools", "tool_choice"],
                COMPLETIONS: ["max_tokens", "temperature", "top_p", "top_k", "seed", "n", "logprobs", "stop",
                              "prompt", "echo"]}


@pytest.fixture(scope="module")
def engine_hapi(fuzz_server_factory: Any, tiny_model_path: Any) -> HarnessApi:
    """A server with the real, batching tiny engine: hostile and normal calls share its batches."""
    from agentjet.layouts import embedded_engine
    from agentjet.settings import GeneratorSettings

    api = fuzz_server_factory(engine=embedded_engine(tiny_model_path,
                                                     GeneratorSettings(max_batch_size=8, batch_wait_ms=20)))
    return HarnessApi(api.bg, api.counts, api.statuses)


@settings(FUZZ, max_examples=max(10, examples() // 3))  # four calls through the real engine per example
@given(bad_path=st.sampled_from(list(HOSTILE_KEYS)), data=st.data())
def test_a_bad_call_on_one_api_never_fails_the_other_apis_calls_in_its_batch(engine_hapi: HarnessApi,
                                                                            bad_path: str, data: st.DataObject) -> None:
    keys = HOSTILE_KEYS[bad_path]
    params = data.draw(st.dictionaries(st.sampled_from(keys), HOSTILE_VALUES, min_size=1, max_size=3), label="params")
    good_ep, bad_ep = engine_hapi.begin("good"), engine_hapi.begin("evil")
    others = [p for p in NORMAL if p != bad_path]
    with ThreadPoolExecutor(len(others) + 1) as pool:
        futures = [pool.submit(engine_hapi.post, p, NORMAL[p], headers=_auth(p, good_ep["api_key"], "bearer"),
                               group="hypothesis:cross-api-normal") for p in others]
        futures.append(pool.submit(engine_hapi.post, bad_path, {**NORMAL[bad_path], **params},
                                   headers=_auth(bad_path, bad_ep["api_key"], "bearer"),
                                   group="hypothesis:cross-api-hostile"))
        *goods, _bad = [f.result() for f in futures]  # (the hostile one: < 500 and in its shape, checked by post)
    assert all(r.status_code == 200 for r in goods), [r.text[:300] for r in goods]
    assert len(episode(engine_hapi, good_ep["episode_id"]).calls) == len(others)
    for ep in (good_ep, bad_ep):
        engine_hapi.post(f"/swarm/v1/episodes/{ep['episode_id']}/abort", token=ep["api_key"], group="setup")
