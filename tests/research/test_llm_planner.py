"""The LLM planner against a fake OpenAI-compatible server: malformed and out-of-range proposals are
rejected or clamped, failures fall back to the offline planner, and nothing crashes the study."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from agentjet.apps.research.llm_planner import LLMPlanner, extract_json
from agentjet.apps.research.planner import OptunaPlanner, params_key
from agentjet.apps.research.spec import StudySpec
from agentjet.apps.research.state import StudyState


class FakeOpenAI:
    """Answers /v1/chat/completions with the scripted replies in order; records the requests."""

    def __init__(self) -> None:
        self.replies: list[Any] = []
        self.requests: list[dict[str, Any]] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):  # noqa: ANN202
            self.requests.append(await request.json())
            reply = self.replies.pop(0) if self.replies else "{}"
            if isinstance(reply, tuple):  # (status, body): an HTTP error or a non-OpenAI body
                status, body = reply
                return PlainTextResponse(body, status_code=status)
            return JSONResponse({"id": "x", "object": "chat.completion", "created": 0, "model": "fake",
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": reply}}]})

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeOpenAI:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start()
    yield server
    server.stop()


def make_spec(url: str) -> StudySpec:
    return StudySpec.model_validate({
        "question": "Which learning rate and group size learn addition fastest?",
        "base": {"servers": {"policy": {"model": "tiny-random"}}},
        "planner": {"kind": "llm", "url": url, "timeout_s": 10, "proposals_per_call": 3},
        "space": {"server.lr": {"type": "float", "low": 1e-5, "high": 1e-4, "log": True, "default": 2e-5},
                  "server.group-size": {"type": "choice", "choices": [4, 8], "default": 8},
                  "server.estimator": {"type": "choice", "choices": ["grpo", "rloo"], "default": "grpo"}}})


def proposal(params: dict, hypothesis: str = "because") -> dict:
    return {"params": params, "hypothesis": hypothesis}


def planner_for(fake: FakeOpenAI) -> tuple[LLMPlanner, StudyState, list[str]]:
    spec = make_spec(fake.url)
    notes: list[str] = []
    planner = LLMPlanner(spec, OptunaPlanner(spec), note=notes.append)
    state = StudyState(digest="d", created_at=0)
    first = planner.propose(state)  # the baseline comes first, without asking the model
    assert first is not None and first.source == "default" and not fake.requests
    state.add_config(first.params, first.source, first.why, 1)
    return planner, state, notes


def test_out_of_range_and_malformed_proposals_are_clamped_or_rejected(fake: FakeOpenAI) -> None:
    planner, state, notes = planner_for(fake)
    fake.replies = [json.dumps({"proposals": [
        proposal({"server.lr": 5.0, "server.group-size": 6, "server.estimator": "rloo"}, "a huge rate"),
        proposal({"server.lr": "fast", "server.group-size": 4, "server.estimator": "grpo"}),
        proposal({"server.lr": 3e-5, "server.batch": 2, "server.group-size": 4, "server.estimator": "grpo"}),
        proposal({"server.lr": 3e-5, "server.group-size": 4, "server.estimator": "ppo"}),
        proposal({"server.lr": 2e-5, "server.group-size": 8, "server.estimator": "grpo"}),  # the default again
        {"params": {"server.lr": 3e-5}},  # no hypothesis
        "just a string",
        proposal({"server.lr": 4e-5}, "only the rate; the rest from the defaults"),
    ]})]
    got = planner.propose(state)
    assert got is not None and got.source == "llm"
    assert got.params == {"server.lr": 1e-4, "server.group-size": 8, "server.estimator": "rloo"}
    assert got.why.startswith("a huge rate") and "clamped" in got.why and "nearest choice 8" in got.why
    state.add_config(got.params, got.source, got.why, 1)
    second = planner.propose(state)  # queued from the same answer: no second request
    assert second is not None and len(fake.requests) == 1
    assert second.params == {"server.lr": 4e-5, "server.group-size": 8, "server.estimator": "grpo"}
    joined = "\n".join(notes)
    for expected in ("'fast' is not a number", "unknown parameters ['server.batch']", "'ppo' is not one of",
                     "repeat of a tried configuration", "malformed proposal (hypothesis: Field required)",
                     "valid dictionary"):
        assert expected in joined, (expected, joined)
    # the model saw the space and the results so far
    prompt = fake.requests[0]["messages"][1]["content"]
    assert "server.lr: float in [1e-05, 0.0001] (log scale)" in prompt and "the default configuration" in prompt


def test_a_reply_that_is_not_json_gets_one_repair_request(fake: FakeOpenAI) -> None:
    planner, state, notes = planner_for(fake)
    good = {"proposals": [proposal({"server.lr": 5e-5, "server.group-size": 4, "server.estimator": "grpo"}, "h")]}
    fake.replies = ["Sure! I would try a higher learning rate.", "```json\n" + json.dumps(good) + "\n```"]
    got = planner.propose(state)
    assert got is not None and got.source == "llm" and got.params["server.lr"] == 5e-5
    assert len(fake.requests) == 2 and "not usable" in fake.requests[1]["messages"][-1]["content"]
    assert any("asking once more" in n for n in notes)


@pytest.mark.parametrize("replies", [
    ["no json here", "still none"],  # malformed twice
    ['{"proposals": "many"}', '{"ideas": []}'],  # valid JSON, wrong schema, twice
    [(500, "upstream exploded")],  # an HTTP error: no repair round
    [(200, "not a chat completion")],
    [json.dumps({"proposals": [proposal({"server.lr": "x"})]})],  # every proposal rejected
])
def test_unusable_answers_fall_back_to_the_offline_planner(fake: FakeOpenAI, replies: list) -> None:
    planner, state, notes = planner_for(fake)
    fake.replies = list(replies)
    got = planner.propose(state)
    assert got is not None and got.source == "llm-fallback" and "no usable proposal" in got.why
    assert params_key(got.params) != params_key(state.configs[0].params)
    assert notes


def test_an_unreachable_endpoint_falls_back_without_waiting_long() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here
    spec = make_spec(f"http://127.0.0.1:{port}/v1")
    notes: list[str] = []
    planner = LLMPlanner(spec, OptunaPlanner(spec), http=httpx.Client(timeout=2), note=notes.append)
    state = StudyState(digest="d", created_at=0)
    state.add_config(spec.default_params() or {}, "default", "baseline", 1)
    got = planner.propose(state)
    assert got is not None and got.source == "llm-fallback" and "cannot reach" in notes[0]


def test_extract_json_and_check_proposal_directly() -> None:
    assert extract_json('Here you go: {"proposals": []} hope it helps') == {"proposals": []}
    spec = make_spec("http://x/v1")
    planner = LLMPlanner(spec, OptunaPlanner(spec))
    params, notes = planner.check(proposal({"server.lr": 1e-6, "server.group-size": 5.9, "server.estimator": "grpo"}),
                                  set())
    assert params == {"server.lr": 1e-5, "server.group-size": 8, "server.estimator": "grpo"} and len(notes) == 2
    params, notes = planner.check(proposal({"server.lr": 2e-5, "server.group-size": True, "server.estimator": "grpo"}),
                                  set())
    assert params is None and "not one of" in notes[0]
    planner.close()
