"""Tinker clients beside swarm traffic on one base: stop strings, seeds that reproduce under other requests, and
swarm training that leaves a Tinker client's adapter as it was."""

from __future__ import annotations

import threading

import httpx
import pytest
import torch

pytestmark = pytest.mark.server
tinker = pytest.importorskip("tinker")
from tests.conftest import wait_until  # noqa: E402
from tests.observe.helpers import play_group  # noqa: E402
from tests.tinker_api.test_training import ADAM, datum  # noqa: E402
from tinker import types  # noqa: E402

PROMPT = types.ModelInput.from_ints([1, 17, 29, 41, 5])


def swarm_chat(url: str, n: int, errors: list[BaseException]) -> list[threading.Thread]:
    """``n`` swarm chat calls at once (unseeded, on the swarm's adapter), each on an episode of its own."""
    def one(i: int) -> None:
        try:
            ep = httpx.post(f"{url}/swarm/v1/episodes", json={"client_id": "c", "task_id": f"t{i}"}, timeout=120).json()
            r = httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {ep['api_key']}"},
                           json={"model": "swarm", "messages": [{"role": "user", "content": f"count to {i}"}],
                                 "max_tokens": 48, "temperature": 1.0}, timeout=120)
            assert r.status_code == 200, r.text
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def test_a_stop_string_ends_a_sample_with_stop(service_client) -> None:
    tc = service_client().create_lora_training_client(base_model="tiny", rank=4).result()
    sc = tc.save_weights_and_get_sampling_client().result()
    tok = tc.get_tokenizer()
    a = sc.sample(PROMPT, 1, types.SamplingParams(max_tokens=12, temperature=1.0, seed=5)).result().sequences[0]
    assert a.stop_reason == "length"
    at = next(i for i, t in enumerate(a.tokens) if tok.decode([t]).strip())  # a token with visible text
    stop = tok.decode([a.tokens[at]]).strip()
    for stop_param in (stop, [stop, "never-in-this-text"]):
        c = sc.sample(PROMPT, 1, types.SamplingParams(max_tokens=12, temperature=1.0, seed=5,
                                                      stop=stop_param)).result().sequences[0]
        assert c.stop_reason == "stop" and len(c.tokens) <= at + 1, (stop, a.tokens, c.tokens)
        assert c.tokens == a.tokens[:len(c.tokens)]  # the same sample, ended at the stop string


def test_a_seed_reproduces_a_sample_under_concurrent_swarm_traffic(tinker_server) -> None:
    srv = tinker_server(training={"admission": False})  # six episodes open at once
    tc = tinker.ServiceClient(base_url=srv.url, api_key="tml-test-key-0123456789").create_lora_training_client(
        base_model="tiny", rank=4).result()
    sc = tc.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95, seed=21)
    alone = sc.sample(PROMPT, 2, params).result().sequences
    errors: list[BaseException] = []
    threads = swarm_chat(srv.url, 6, errors)
    busy = [sc.sample(PROMPT, 2, params) for _ in range(2)]  # beside the chat calls, and beside each other
    got = [f.result().sequences for f in busy]
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert srv.server.counters.requests.calls >= 6
    assert alone[0].tokens != alone[1].tokens  # sample i uses seed + i
    for seqs in got:
        assert [s.tokens for s in seqs] == [s.tokens for s in alone]
        for s, ref in zip(seqs, alone, strict=True):
            assert s.logprobs == pytest.approx(ref.logprobs, abs=1e-4)


def test_swarm_training_leaves_a_tinker_clients_adapter_unchanged(tinker_server) -> None:
    srv = tinker_server()
    tc = tinker.ServiceClient(base_url=srv.url, api_key="tml-test-key-0123456789").create_lora_training_client(
        base_model="tiny", rank=4).result()
    tc.forward_backward([datum([1, 2, 3, 4, 5], weights=[1.0] * 4)], "cross_entropy").result()
    tc.optim_step(ADAM).result()  # a trained adapter, with optimizer state
    adapters = srv.server.adapters
    assert adapters is not None
    mine = adapters.engine(tc.model_id).learner
    swarm = adapters.engine("swarm").learner
    before = [p.detach().clone() for p in mine.params]
    swarm_before = [p.detach().clone() for p in swarm.params]
    play_group(srv.url, "g1", [1.0, 0.0], agent="swarm")
    play_group(srv.url, "g2", [0.0, 1.0], agent="swarm")
    wait_until(lambda: srv.server.counters.training.train_steps >= 1, timeout=60)
    assert not all(torch.equal(a, b) for a, b in zip(swarm_before, swarm.params, strict=True))  # the swarm moved
    assert all(torch.equal(a, b) for a, b in zip(before, mine.params, strict=True))  # the Tinker client did not
