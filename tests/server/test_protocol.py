"""The HTTP API on a real server with a null engine: auth, errors, leases, idempotent end, per-agent rewards."""

from __future__ import annotations

import httpx
import pytest
from tests.conftest import settle, wait_until

from agentjet.runtime.clock import FakeClock

USER = [{"role": "user", "content": "hi"}]


def begin(url: str, task_id: str = "t1", **extra) -> dict:
    r = httpx.post(f"{url}/swarm/v1/episodes", json={"client_id": "c1", "task_id": task_id, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def chat(url: str, key: str | None, body: dict | None = None, headers: dict | None = None) -> httpx.Response:
    h = {"Authorization": f"Bearer {key}"} if key else {}
    h.update(headers or {})
    return httpx.post(f"{url}/v1/chat/completions", json=body or {"model": "tiny", "messages": USER}, headers=h)


def end(url: str, ep: dict, reward) -> httpx.Response:
    return httpx.post(f"{url}/swarm/v1/episodes/{ep['episode_id']}/end", json={"reward": reward},
                      headers={"Authorization": f"Bearer {ep['api_key']}"})


def assert_openai_error(r: httpx.Response, status: int, fragment: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert fragment.lower() in err["message"].lower()


def test_chat_call_is_recorded_and_shaped_like_openai(make_server) -> None:
    srv = make_server(reply="hello there")
    ep = begin(srv.url)
    assert ep["api_key"].startswith("aj-ep-") and len(ep["api_key"]) > 40
    r = chat(srv.url, ep["api_key"], {"model": "tiny", "messages": USER, "logprobs": True, "top_logprobs": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello there"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == len(body["choices"][0]["logprobs"]["content"])
    calls = srv.server.registry.get(ep["episode_id"]).calls
    assert len(calls) == 1 and calls[0].agent == "default"
    assert calls[0].completion_ids[-1] == srv.server.engine.tokenizer.eos_token_id


def test_models_endpoint(make_server) -> None:
    srv = make_server()
    data = httpx.get(f"{srv.url}/v1/models").json()
    assert data["data"][0]["id"] == "tiny"


@pytest.mark.parametrize(("body", "fragment"), [
    ({"model": "tiny", "messages": []}, "at least one message"),
    ({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "text parts"),
    ({"model": "tiny", "messages": USER, "n": 99}, "n"),
    ({"model": "tiny", "messages": USER, "temperature": "hot"}, "temperature"),
    ({"model": "tiny", "messages": USER, "max_tokens": 10**7}, "context"),
    ({"model": "tiny", "messages": USER, "frequency_penalty": 1.0}, "not supported"),
    ({"model": "tiny", "messages": USER, "seed": 2**64}, "seed"),
    ({"model": "tiny", "messages": USER, "seed": -1}, "seed"),
    ({"model": "tiny", "messages": USER, "top_k": 1e30}, "top_k"),
    ({"model": "tiny", "messages": USER, "top_k": 10**6}, "vocabulary"),
    ({"model": "tiny", "messages": USER, "stop": ["x" * 1001]}, "stop"),
    ({"model": "tiny", "messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "not among the tools"),
    ({"model": "tiny", "messages": USER, "tool_choice": "sometimes"}, "tool_choice"),
    ({"model": "tiny", "messages": USER, "tools": [{"type": "function",
                                                    "function": {"name": "f", "parameters": [1, 2]}}]},
     "parameters must be a JSON Schema object"),
    ({"model": "tiny", "messages": [{"role": "assistant", "content": "",
                                     "tool_calls": [{"id": "1", "type": "function",
                                                     "function": {"name": "f", "arguments": "{bad"}}]}]},
     "not valid JSON"),
])
def test_bad_chat_requests_get_clear_400s(make_server, body: dict, fragment: str) -> None:
    srv = make_server()
    ep = begin(srv.url)
    r = chat(srv.url, ep["api_key"], body)
    assert_openai_error(r, 400, fragment)
    bad_params = {"seed", "top_k", "stop", "tool_choice", "n", "temperature"} & set(body)
    if bad_params:  # the error names the offending field
        assert r.json()["error"]["param"] in bad_params or any(p in r.json()["error"]["param"] for p in bad_params)
    assert srv.server.registry.get(ep["episode_id"]).calls == []  # nothing recorded


def test_malformed_json_is_a_400(make_server) -> None:
    srv = make_server()
    ep = begin(srv.url)
    r = httpx.post(f"{srv.url}/v1/chat/completions", content=b"{not json",
                   headers={"Authorization": f"Bearer {ep['api_key']}", "Content-Type": "application/json"})
    assert_openai_error(r, 400, "json")


def test_keys_are_required_and_scoped(make_server) -> None:
    srv = make_server()
    a, b = begin(srv.url), begin(srv.url)
    assert_openai_error(chat(srv.url, None), 401, "missing episode key")
    assert_openai_error(chat(srv.url, "aj-ep-guess"), 401, "unknown")
    r = httpx.post(f"{srv.url}/swarm/v1/episodes/{b['episode_id']}/end", json={"reward": 1.0},
                   headers={"Authorization": f"Bearer {a['api_key']}"})
    assert_openai_error(r, 403, "another episode")
    assert end(srv.url, a, 1.0).status_code == 200
    assert_openai_error(chat(srv.url, a["api_key"]), 401, "no longer accepts calls")


def test_swarm_token_gates_join_and_begin(make_server) -> None:
    srv = make_server(swarm_token="s3cret")
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "c", "task_id": "t"})
    assert_openai_error(r, 401, "swarm token")
    r = httpx.post(f"{srv.url}/swarm/v1/join", json={"client_id": "c"}, headers={"Authorization": "Bearer nope"})
    assert_openai_error(r, 401, "swarm token")
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "c", "task_id": "t"},
                   headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 200


def test_end_is_idempotent_and_trained_once(make_server) -> None:
    srv = make_server(training={"group_size": 2})
    eps = [begin(srv.url) for _ in range(2)]
    for ep in eps:
        assert chat(srv.url, ep["api_key"]).status_code == 200
    first = [end(srv.url, ep, float(i)).json() for i, ep in enumerate(eps)]
    assert [f["duplicate"] for f in first] == [False, False]
    for _ in range(3):  # retried three times
        again = end(srv.url, eps[0], 0.0).json()
        assert again["duplicate"] is True and again["acknowledged"] is True
    wait_until(lambda: srv.server.counters.training.train_steps >= 1)
    settle(srv)  # whatever else was ready has trained by now
    consumed = srv.server.store.consumed_steps()
    assert {e["episode_id"] for e in eps} <= set(consumed)
    assert all(len(steps) == 1 for steps in consumed.values())
    assert srv.server.counters.training.train_steps == 1
    assert len(srv.server.engine.learner.trained) == 1 and len(srv.server.engine.learner.trained[0]) == 2


def test_reward_validation(make_server) -> None:
    srv = make_server()
    ep = begin(srv.url)
    chat(srv.url, ep["api_key"], headers={"X-Agent-Name": "planner"})
    for bad, fragment in ((float("nan"), "finite"), ("high", "reward"), ({}, "empty"),
                          ({"planner": 1.0, "ghost": 0.0}, "unknown ['ghost']"), ({"other": 1.0}, "missing")):
        r = httpx.post(f"{srv.url}/swarm/v1/episodes/{ep['episode_id']}/end",
                       content=f'{{"reward": {"NaN" if bad != bad else __import__("json").dumps(bad)}}}',
                       headers={"Authorization": f"Bearer {ep['api_key']}", "Content-Type": "application/json"})
        assert r.status_code == 400, (bad, r.text)
        assert fragment.lower() in r.text.lower(), (bad, r.text)
    assert end(srv.url, ep, {"planner": 0.5}).status_code == 200


def test_per_agent_rewards_reach_each_agents_samples(make_server) -> None:
    srv = make_server(training={"group_size": 2})
    eps = [begin(srv.url) for _ in range(2)]
    for ep in eps:
        assert chat(srv.url, ep["api_key"], {"model": "planner", "messages": USER}).status_code == 200
        assert chat(srv.url, ep["api_key"], headers={"X-Agent-Name": "executor"}).status_code == 200
    end(srv.url, eps[0], {"planner": 1.0, "executor": 0.0})
    end(srv.url, eps[1], {"planner": 0.0, "executor": 0.0})
    wait_until(lambda: srv.server.counters.training.train_steps >= 1)
    batch = srv.server.engine.learner.trained[0]
    assert len(batch) == 4
    # planner rewards differ (1 vs 0): non-zero advantages; executor rewards are equal: zero advantages
    planner_advs = sorted(max(s.advantages, key=abs) for s in batch if abs(max(s.advantages, key=abs)) > 0)
    assert len(planner_advs) == 2 and planner_advs[0] < 0 < planner_advs[1]


def test_lease_expiry_cleans_the_episode(make_server) -> None:
    srv = make_server(lease_seconds=0.6)
    ep = begin(srv.url)
    assert chat(srv.url, ep["api_key"]).status_code == 200
    wait_until(lambda: srv.server.registry.counts["expired"] == 1, timeout=10)
    r = httpx.post(f"{srv.url}/swarm/v1/episodes/{ep['episode_id']}/heartbeat",
                   headers={"Authorization": f"Bearer {ep['api_key']}"})
    assert_openai_error(r, 409, "expired")
    assert_openai_error(end(srv.url, ep, 1.0), 409, "expired")
    assert srv.server.registry.open_count == 0


def test_a_failing_sweep_does_not_end_the_lease_sweeping(make_server, monkeypatch) -> None:
    clock = FakeClock()
    srv = make_server(lease_seconds=0.8, clock=clock)
    registry = srv.server.registry
    real, failures = registry.expire_due, []

    def fails_once():
        if not failures:
            failures.append(1)
            raise RuntimeError("a bad sweep")
        return real()

    monkeypatch.setattr(registry, "expire_due", fails_once)
    ep = begin(srv.url)
    wait_until(lambda: failures, timeout=10)
    clock.advance(1.0)
    wait_until(lambda: registry.counts["expired"] == 1, timeout=10)  # the next sweep still runs
    assert_openai_error(end(srv.url, ep, 1.0), 409, "expired")


def test_heartbeats_keep_the_lease(make_server) -> None:
    """On the fake clock: an episode heartbeated every 0.4 s outlives its 0.6 s lease many times over; one begun
    beside it and not heartbeated expires within the same time."""
    clock = FakeClock()
    srv = make_server(lease_seconds=0.6, clock=clock)
    ep, idle = begin(srv.url), begin(srv.url)
    for _ in range(8):
        clock.advance(0.4)
        r = httpx.post(f"{srv.url}/swarm/v1/episodes/{ep['episode_id']}/heartbeat",
                       headers={"Authorization": f"Bearer {ep['api_key']}"})
        assert r.status_code == 200
    wait_until(lambda: srv.server.registry.counts["expired"] == 1, timeout=10)  # the reaper saw the fake time
    assert_openai_error(end(srv.url, idle, 1.0), 409, "expired")
    assert end(srv.url, ep, 1.0).status_code == 200


def test_rejoin_releases_leftover_episodes(make_server) -> None:
    srv = make_server()
    ep = begin(srv.url)
    r = httpx.post(f"{srv.url}/swarm/v1/join", json={"client_id": "c1"})
    assert r.json()["released_episodes"] == 1
    assert_openai_error(chat(srv.url, ep["api_key"]), 401, "aborted")


def test_abort_discards_calls(make_server) -> None:
    srv = make_server()
    ep = begin(srv.url)
    chat(srv.url, ep["api_key"])
    r = httpx.post(f"{srv.url}/swarm/v1/episodes/{ep['episode_id']}/abort", json={"reason": "tool crashed"},
                   headers={"Authorization": f"Bearer {ep['api_key']}"})
    assert r.json()["status"] == "aborted"
    assert_openai_error(end(srv.url, ep, 1.0), 409, "aborted")
    assert srv.server.status().buffer.aborted_episodes == 1


def test_tool_calls_parsed_and_history_rendered(make_server) -> None:
    reply = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    srv = make_server(reply=reply)
    ep = begin(srv.url)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    r = chat(srv.url, ep["api_key"], {"model": "tiny", "messages": USER, "tools": tools})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert call["function"]["arguments"] == '{"city": "Paris"}'
    history = USER + [choice["message"], {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    r2 = chat(srv.url, ep["api_key"], {"model": "tiny", "messages": history, "tools": tools})
    assert r2.status_code == 200, r2.text
    calls = srv.server.registry.get(ep["episode_id"]).calls
    text = srv.server.engine.tokenizer.decode(calls[1].prompt_ids)
    assert "get_weather" in text and "sunny" in text and "<tool_call>" in text
    # without tools in the request the same output is plain text
    r3 = chat(srv.url, ep["api_key"])
    assert r3.json()["choices"][0]["message"]["content"] == reply.replace("<tool_call>", "<tool_call>")


def test_status_and_eval_episodes(make_server) -> None:
    srv = make_server()
    ep = begin(srv.url, eval=True)
    chat(srv.url, ep["api_key"])
    end(srv.url, ep, 0.75)
    status = httpx.get(f"{srv.url}/swarm/v1/status").json()
    assert status["buffer"]["eval_episodes"] == 1
    assert status["buffer"]["pending_episodes"] == 0
    assert status["eval_reward"] == {"0": 0.75}
    assert "admin_token" not in status["config"]


def test_oversized_body_is_a_413(make_server) -> None:
    srv = make_server(max_body_bytes=4096)
    ep = begin(srv.url)
    big = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 10_000}]}
    assert_openai_error(chat(srv.url, ep["api_key"], big), 413, "")

    def chunks():
        yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}]}'

    r = httpx.post(f"{srv.url}/v1/chat/completions", content=chunks(),
                   headers={"Authorization": f"Bearer {ep['api_key']}", "Content-Type": "application/json"})
    assert r.status_code == 413
    assert chat(srv.url, ep["api_key"]).status_code == 200  # the server is fine afterwards


def test_oversized_body_from_an_async_client_gets_the_413_not_a_reset(make_server) -> None:
    import asyncio

    srv = make_server(max_body_bytes=4096)
    ep = begin(srv.url)
    big = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 3_000_000}]}

    async def main() -> list[int]:
        async with httpx.AsyncClient() as client:
            rs = [await client.post(f"{srv.url}/v1/chat/completions", json=big,
                                    headers={"Authorization": f"Bearer {ep['api_key']}"}) for _ in range(3)]
        return [r.status_code for r in rs]

    assert asyncio.run(main()) == [413, 413, 413]


def test_per_client_open_episode_cap(make_server) -> None:
    srv = make_server(max_open_episodes_per_client=2)
    a, _ = begin(srv.url), begin(srv.url)
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "c1", "task_id": "t"})
    assert_openai_error(r, 429, "2 open episodes")
    assert httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "c2", "task_id": "t"}).status_code == 200
    chat(srv.url, a["api_key"])
    end(srv.url, a, 1.0)
    assert begin(srv.url)["api_key"]  # a slot is free again


def test_unwritable_store_refuses_new_episodes_and_keeps_the_open_one(make_server) -> None:
    import sqlite3

    srv = make_server()
    ep = begin(srv.url)
    chat(srv.url, ep["api_key"])
    store = srv.server.store
    real_db = store._conn.db

    class FullDisk:
        def __getattr__(self, name):
            return getattr(real_db, name)

        def execute(self, sql, *args):
            if sql.lstrip().upper().startswith(("INSERT", "CREATE")):
                raise sqlite3.OperationalError("database or disk is full")
            return real_db.execute(sql, *args)

        def cursor(self):
            cur = real_db.cursor()

            class Cur:
                def __getattr__(self, name):
                    return getattr(cur, name)

                def execute(self, sql, *args):
                    if sql.lstrip().upper().startswith("INSERT"):
                        raise sqlite3.OperationalError("database or disk is full")
                    return cur.execute(sql, *args)

            return Cur()

    store._conn.db = FullDisk()
    assert_openai_error(end(srv.url, ep, 1.0), 503, "disk is full")
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"client_id": "c1", "task_id": "t"})
    assert_openai_error(r, 503, "accepts no new episodes")
    assert srv.server.registry.get(ep["episode_id"]).is_open  # nothing lost: the end can be retried
    store._conn.db = real_db  # the disk has room again
    assert end(srv.url, ep, 1.0).json()["acknowledged"] is True
    assert begin(srv.url)["api_key"]
    assert srv.server.reader.count_by_status()["pending"] == 1


def test_an_unknown_route_answers_in_the_shape_of_the_api_it_is_under(make_server) -> None:
    """The router's own 404 (no route matched: a fuzzed path, a typo) names the route asked for, in the shape of
    the API the path is under: Anthropic's under /v1/messages, the Tinker SDK's under /api/v1, OpenAI's elsewhere."""
    srv = make_server()
    openai_shape = httpx.get(f"{srv.url}/v1/no-such-route")
    assert openai_shape.status_code == 404
    assert openai_shape.json()["error"]["type"] == "not_found_error"
    assert "GET '/v1/no-such-route'" in openai_shape.json()["error"]["message"]
    anthropic = httpx.post(f"{srv.url}/v1/messages/no-such-route", json={})
    assert anthropic.status_code == 404
    assert anthropic.json()["type"] == "error" and anthropic.json()["error"]["type"] == "not_found_error"
    tinker = httpx.get(f"{srv.url}/api/v1/training_runs/a/checkpoints/%0A/no-such-route")
    assert tinker.status_code == 404 and isinstance(tinker.json()["error"], str)
    assert "no route GET" in tinker.json()["error"]
