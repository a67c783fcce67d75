"""What the server does with the errors a rollout engine raises: EngineUnavailableError is a 503 (the server
stays up), TrainingHaltedError pauses training and says why in the status."""

from __future__ import annotations

import asyncio
import json

import httpx
from tests.conftest import settle, wait_until

from agentjet import SwarmClient
from agentjet.engines.errors import EngineUnavailableError, TrainingHaltedError
from agentjet.layouts.null import NullGenerator, NullLearner, compose_null

USER = [{"role": "user", "content": "what is 2 + 2?"}]


class FlakyGenerator(NullGenerator):
    down = False

    async def generate(self, prompt_ids, sampling, on_token=None):
        if self.down:
            raise EngineUnavailableError("vLLM crashed during the request (exit code -9); it is being restarted", 30)
        return await super().generate(prompt_ids, sampling, on_token)


class FlakyLearner(NullLearner):
    halt = False
    train_calls = 0

    async def train_step(self, batch):
        self.train_calls += 1
        if self.halt:
            raise TrainingHaltedError("vLLM and the trainer disagree on the probe prompt")
        return await super().train_step(batch)


def flaky(tokenizer) -> tuple[FlakyGenerator, FlakyLearner, object]:
    generator, learner = FlakyGenerator(tokenizer), FlakyLearner()
    return generator, learner, compose_null(generator, learner)


def begin(url: str) -> str:
    r = httpx.post(f"{url}/swarm/v1/episodes", json={"client_id": "c", "task_id": "t"})
    r.raise_for_status()
    return r.json()["api_key"]


def test_unavailable_engine_is_a_503_and_the_server_stays_up(make_server, tiny_model_path):
    from transformers import AutoTokenizer

    generator, _, engine = flaky(AutoTokenizer.from_pretrained(tiny_model_path))
    srv = make_server(engine)
    key = begin(srv.url)
    headers = {"Authorization": f"Bearer {key}"}
    generator.down = True
    r = httpx.post(f"{srv.url}/v1/chat/completions", json={"model": "tiny", "messages": USER}, headers=headers)
    assert r.status_code == 503 and r.headers["retry-after"] == "30"
    assert r.json()["error"]["code"] == "engine_unavailable" and "crashed" in r.json()["error"]["message"]
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", headers=headers,
                      json={"model": "tiny", "messages": USER, "stream": True}) as s:
        events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[-1])["error"]["code"] == "engine_unavailable"
    assert httpx.get(f"{srv.url}/health").status_code == 200
    generator.down = False
    r = httpx.post(f"{srv.url}/v1/chat/completions", json={"model": "tiny", "messages": USER}, headers=headers)
    assert r.status_code == 200


def test_training_halted_pauses_training_and_says_why(make_server, tiny_model_path):
    from transformers import AutoTokenizer

    _, learner, engine = flaky(AutoTokenizer.from_pretrained(tiny_model_path))
    learner.halt = True
    srv = make_server(engine, training={"group_size": 2, "batch_groups": 1})

    async def episodes() -> None:
        async with SwarmClient(srv.url) as client:
            for reward in (1.0, 0.0):
                async with client.episode(task_id="t1") as ep:
                    await ep.openai().chat.completions.create(model="tiny", messages=USER, max_tokens=4)
                    ep.reward(reward)

    asyncio.run(episodes())
    wait_until(lambda: httpx.get(f"{srv.url}/swarm/v1/status").json()["training_halted"] is not None)
    status = httpx.get(f"{srv.url}/swarm/v1/status").json()
    assert "disagree on the probe" in status["training_halted"]
    assert status["engine_state"] == "paused" and status["buffer"]["pending_episodes"] == 2  # nothing lost
    calls = learner.train_calls
    settle(srv)  # the train loop went over the pending episodes again
    assert learner.train_calls == calls  # no retry loop while halted
