"""Kept prefixes (``generators/hf/prefix_cache.py``): an agent's next call, which resends its history, prefills only
what is new, and its logprobs are still the model's; any weight change forgets what was kept; the budget holds.

The cache's own rules run on made-up keys and values and a counter for the engine thread's jobs; the engine's run on
the tiny model, in process and (what a caller sees) in the engine process."""

from __future__ import annotations

import asyncio

import pytest
import torch
from tests.generators.test_continuous import LAYOUTS, max_diff, staggered, teacher_forced

from agentjet.engines.base import SamplingParams, TrainSample
from agentjet.generators.hf.prefix_cache import KEEP_MIN_TOKENS, MATCH_MIN_TOKENS, PrefixCache
from agentjet.layouts.composed import ComposedEngine

# ------------------------------------------------------------------ the cache's rules


class Jobs:
    """Stands in for ``EngineWorker.changes``."""

    def __init__(self) -> None:
        self.changes = 0


def kv(n: int, fill: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, n, 4), fill), torch.full((2, n, 4), fill)) for _ in range(3)]


def kept(cache: PrefixCache, slot: int, ids: list[int], adapter: str = "base") -> bool:
    """Seat a row in ``slot`` and finish it with ``ids``: whether the cache kept it."""
    cache.seat(slot)
    if not cache.wants(slot, len(ids)):
        return False
    cache.keep(ids, adapter, kv(len(ids)))
    return True


def test_the_longest_common_prefix_of_the_same_adapter_is_reused() -> None:
    cache = PrefixCache(10_000, lambda: 0)
    a = list(range(1, 401))
    b = [*range(1, 201), *range(900, 1100)]  # shares 200 tokens with a
    assert kept(cache, 0, a) and kept(cache, 1, b)
    hit = cache.match([*a, 7, 8], "base")
    assert hit is not None and hit.tokens == 400 and hit.entry.ids.tolist() == a
    hit = cache.match([*range(1, 201), *range(900, 950), 5], "base")
    assert hit is not None and hit.tokens == 250  # b shares more than a
    assert cache.match(a, "base").tokens == 399  # one token is left to run: its logits are the first token's
    assert cache.match([*a, 7], "other") is None  # another adapter's keys are not this one's
    assert cache.match([*range(1, MATCH_MIN_TOKENS), 5000, *range(10)], "base") is None  # too short a prefix
    assert cache.stats["prefix_hits"] == 3 and cache.stats["prefix_reused_tokens"] == 400 + 250 + 399


def test_a_newer_call_replaces_the_one_it_extends_and_the_budget_evicts_the_least_recently_used() -> None:
    cache = PrefixCache(1000, lambda: 0)
    first = list(range(1, 301))
    assert kept(cache, 0, first)
    second = [*first, *range(2000, 2100)]  # the same episode's next call
    assert kept(cache, 0, second)
    assert cache.entries == 1 and cache.tokens == 400
    other = list(range(5000, 5400))
    assert kept(cache, 1, other)
    assert cache.match([*second, 1], "base") is not None  # second is now the most recently used
    third = list(range(7000, 7300))
    assert kept(cache, 2, third)  # 400 + 400 + 300 > 1000: the least recently used (other) goes
    assert cache.tokens == 700 and cache.stats["prefix_evicted"] == 1
    assert cache.match([*other, 1], "base") is None
    assert not kept(cache, 3, list(range(1001)))  # more than the whole budget: not kept
    assert not kept(cache, 3, list(range(KEEP_MIN_TOKENS - 1)))  # too short to be worth the copy


def test_a_job_on_the_engine_thread_forgets_every_entry_and_a_row_it_overtook_is_not_kept() -> None:
    jobs = Jobs()
    cache = PrefixCache(10_000, lambda: jobs.changes)
    ids = list(range(1, 301))
    assert kept(cache, 0, ids)
    jobs.changes += 1  # a train step, a weight push, an adapter added
    assert cache.match([*ids, 1], "base") is None and cache.entries == 0
    assert cache.stats["prefix_forgotten"] == 1
    cache.seat(1)  # a row starts on the old weights ...
    jobs.changes += 1  # ... a train step runs between two of its decode steps ...
    assert not cache.wants(1, 400)  # ... so its keys come from two sets of weights: not kept
    cache.seat(1)
    assert cache.wants(1, 400)


# ------------------------------------------------------------------ the engine


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(10, 1000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def an_episode(engine: ComposedEngine, turns: int, first: int = 300, delta: int = 60, tokens: int = 12):
    """``turns`` calls of one episode: each prompt is the previous prompt, its reply and ``delta`` new tokens."""
    prompt, results, prompts = random_ids(first, 0), [], []
    for turn in range(turns):
        params = SamplingParams(temperature=1.0, max_tokens=tokens, seed=turn)
        prompts.append(prompt)
        results.append(staggered(engine, [prompt], [params])[0])
        prompt = [*prompt, *results[-1].token_ids, *random_ids(delta, 100 + turn)]
    return prompts, results


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_episodes_next_call_prefills_only_what_is_new_with_the_models_logprobs(make_engine, layout: str) -> None:
    engine = make_engine(layout, kv_cache_tokens=64)  # small: the cache grows and compacts under the reused rows
    plain = make_engine(layout, prefix_cache_tokens=0)
    prompts, results = an_episode(engine, 3)
    stats = engine.generator.stats
    assert stats["prefix_hits"] == 2 and stats["prefix_kept"] == 3
    # each call reuses the previous call's prompt and all of its reply but the last token
    assert stats["prefix_reused_tokens"] == sum(len(p) + len(r.token_ids) - 1
                                                for p, r in zip(prompts[:2], results[:2], strict=True))
    assert engine.describe()["prefix_cache"]["entries"] == 1  # each call replaced the one it extends
    for p, r in zip(prompts, results, strict=True):
        assert max_diff(r.logprobs, teacher_forced(engine, p, r.token_ids, 1.0)) < 1e-4
    _, again = an_episode(plain, 3)
    assert [r.token_ids for r in again] == [r.token_ids for r in results]
    assert "prefix_hits" not in plain.generator.stats and plain.describe()["prefix_cache"] is None


def test_a_reused_row_joins_a_running_batch_exactly(make_engine) -> None:
    """A call that reuses a prefix joins while another row is generating: its columns land wherever ``t`` is."""
    engine = make_engine(kv_cache_tokens=64)
    prompts, results = an_episode(engine, 1)
    follow = [*prompts[0], *results[0].token_ids, *random_ids(40, 7)]
    long, short = random_ids(20, 9), random_ids(25, 10)
    params = [SamplingParams(temperature=1.0, max_tokens=m, seed=s) for m, s in ((60, 1), (15, 2), (10, 3))]
    out = staggered(engine, [long, follow, short], params, gaps_s=[0.05])
    assert engine.generator.stats["prefix_hits"] == 1
    for p, r in zip([long, follow, short], out, strict=True):
        assert max_diff(r.logprobs, teacher_forced(engine, p, r.token_ids, 1.0)) < 1e-4


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_train_step_forgets_the_kept_prefixes(make_engine, layout: str) -> None:
    engine = make_engine(layout)
    engine.set_learning_rate(1e-2)
    prompts, results = an_episode(engine, 1)
    sample = TrainSample(prompts[0] + results[0].token_ids, [0] * len(prompts[0]) + [1] * len(results[0].token_ids),
                         [0.0] * len(prompts[0]) + results[0].logprobs,
                         [0.0] * len(prompts[0]) + [1.0] * len(results[0].token_ids))
    asyncio.run(engine.train_step([sample]))
    follow = [*prompts[0], *results[0].token_ids, *random_ids(60, 5)]
    r = staggered(engine, [follow], [SamplingParams(temperature=1.0, max_tokens=12, seed=4)])[0]
    stats = engine.generator.stats
    assert stats["prefix_hits"] == 0 and stats["prefix_forgotten"] == 1
    assert r.policy_version == 1
    assert max_diff(r.logprobs, teacher_forced(engine, follow, r.token_ids, 1.0)) < 1e-4  # the new weights' keys


def test_a_ping_keeps_them_and_short_rows_are_not_kept(make_engine) -> None:
    engine = make_engine()
    prompts, results = an_episode(engine, 1)
    asyncio.run(engine.generator.worker.read(lambda: None))  # a health ping reads: nothing changed
    staggered(engine, [[*prompts[0], *results[0].token_ids, 1, 2, 3]], [SamplingParams(max_tokens=2, seed=1)])
    staggered(engine, [random_ids(40, 3)], [SamplingParams(max_tokens=2, seed=1)])
    stats = engine.generator.stats
    assert stats["prefix_hits"] == 1 and stats["prefix_kept"] == 2  # the 40-token call was not kept
