"""Version skew between a swarm client and server: the server refuses request fields it does not know; a client
ignores reply fields it does not know (an older client against a newer server keeps working)."""

from __future__ import annotations

import inspect

import httpx
import pytest
from pydantic import BaseModel, ValidationError

from agentjet import protocol
from agentjet.protocol import BeginEpisodeResponse, ServerStatus

MODELS = [m for _, m in inspect.getmembers(protocol, inspect.isclass)
          if issubclass(m, BaseModel) and m.__module__ == protocol.__name__ and not m.__name__.startswith("_")]
REQUESTS = [m for m in MODELS if issubclass(m, protocol._Request)]
REPLIES = [m for m in MODELS if issubclass(m, protocol._Reply)]
RECORDS = [m for m in MODELS if issubclass(m, protocol._Record)]


def test_every_protocol_model_is_a_request_or_a_reply() -> None:
    """... or a record both sides keep in files (not on the wire), which is strict like a request."""
    assert sorted(m.__name__ for m in MODELS) == sorted(m.__name__ for m in REQUESTS + REPLIES + RECORDS)
    assert {m.__name__ for m in RECORDS} == {"EvalPoint"}
    assert {m.__name__ for m in REQUESTS} >= {"JoinRequest", "BeginEpisodeRequest", "EndEpisodeRequest"}
    assert {m.__name__ for m in REPLIES} >= {"JoinResponse", "BeginEpisodeResponse", "ServerStatus"}


@pytest.mark.parametrize("model", REQUESTS + RECORDS, ids=lambda m: m.__name__)
def test_a_request_with_an_unknown_field_is_refused(model: type[BaseModel]) -> None:
    with pytest.raises(ValidationError, match="from_the_future"):
        model.model_validate({"from_the_future": 1})


def test_a_newer_servers_reply_still_parses(make_server) -> None:
    srv = make_server()
    status = httpx.get(f"{srv.url}/swarm/v1/status").raise_for_status().json()
    status["a_new_section"] = {"x": 1}
    status["buffer"]["a_new_count"] = 7
    parsed = ServerStatus.model_validate(status)
    assert parsed.policy_version == 0 and not hasattr(parsed, "a_new_section")
    begin = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "c1", "task_id": "t1"}).json()
    assert BeginEpisodeResponse.model_validate({**begin, "a_new_field": True}).episode_id == begin["episode_id"]


def test_the_server_names_an_unknown_begin_field(make_server) -> None:
    srv = make_server()
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "c1", "task_id": "t1", "tsak_type": "math"})
    assert r.status_code == 400, r.text
    assert "tsak_type" in r.json()["error"]["message"]
    assert srv.server.status().buffer.open_episodes == 0
