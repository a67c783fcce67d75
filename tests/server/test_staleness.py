"""The staleness bound per token (``server/staleness.py``): tokens older than ``max_staleness`` versions are masked
out of the loss, a sample or an episode whose tokens are all stale is dropped; through a real server with the
null engine, a reply that spans an update is trained on its fresh tokens and its trace shows the change."""

from __future__ import annotations

import asyncio
import math
import sqlite3
from pathlib import Path

import httpx
from tests.conftest import wait_until
from transformers import AutoTokenizer

from agentjet import SwarmClient
from agentjet.layouts.null import null_engine
from agentjet.server.store import SQLiteStore, StoredEpisode, StoredStatus
from agentjet.server.training.staleness import all_stale, fresh_samples, logprobs_on_stored_mask, stale_mask
from agentjet.tracking import NO_VERSION, EpisodeSample

USER = [{"role": "user", "content": "what is 2 + 2?"}]


def sample(versions: list[int], mask: list[int]) -> EpisodeSample:
    n = len(versions)
    return EpisodeSample(input_ids=list(range(n)), loss_mask=mask, behaviour_logprobs=[-1.0 * m for m in mask],
                         agent="a", temperature=1.0, call_indices=[0],
                         min_policy_version=min((v for v, m in zip(versions, mask, strict=True) if m), default=0),
                         token_versions=versions)


def episode(min_v: int, max_v: int | None) -> StoredEpisode:
    return StoredEpisode(episode_id="e", key_hash="", client_id="c", task_id="t", task_type="default",
                         group_key="t", reward=1.0, status=StoredStatus.PENDING, n_calls=1, n_samples=1,
                         begin_policy_version=min_v, min_policy_version=min_v, ended_at=0.0,
                         max_policy_version=max_v)


def test_the_mask_drops_exactly_the_stale_tokens() -> None:
    s = sample([NO_VERSION, NO_VERSION, 3, 3, 4, NO_VERSION, 4, 5, 5], [0, 0, 1, 1, 1, 0, 1, 1, 1])
    # learner at v6, at most 2 versions old: v3 tokens are stale, v4 and v5 are not
    mask, masked = stale_mask(s, version=6, max_staleness=2)
    assert mask == [0, 0, 0, 0, 1, 0, 1, 1, 1] and masked == 2
    assert stale_mask(s, version=7, max_staleness=2) == ([0, 0, 0, 0, 0, 0, 0, 1, 1], 4)
    assert stale_mask(s, version=5, max_staleness=2) == (s.loss_mask, 0)


def test_a_sample_whose_tokens_are_all_stale_leaves_the_batch() -> None:
    spanning = sample([NO_VERSION, 1, 1, 2, 2], [0, 1, 1, 1, 1])
    old = sample([NO_VERSION, 1, 1], [0, 1, 1])
    untrained = sample([NO_VERSION, NO_VERSION], [0, 0])
    out = fresh_samples([(0, spanning), (1, old), (2, untrained)], version=2, max_staleness=0)
    assert [i for i, _ in out.kept] == [0, 2]
    assert out.kept[0][1].loss_mask == [0, 0, 0, 1, 1] and spanning.loss_mask == [0, 1, 1, 1, 1]  # a copy
    assert out.kept[1][1] is untrained
    assert (out.tokens, out.masked) == (6, 4)


def test_an_episode_is_dropped_only_when_its_newest_token_is_stale() -> None:
    assert not all_stale(episode(0, 1), version=1, max_staleness=0)  # its v1 tokens are fresh
    assert all_stale(episode(0, 1), version=2, max_staleness=0)
    assert all_stale(episode(0, None), version=1, max_staleness=0)  # stored before per-token versions: as before
    assert not all_stale(episode(0, None), version=1, max_staleness=1)


def test_trainer_logprobs_stay_on_their_tokens_when_some_were_masked() -> None:
    laid = logprobs_on_stored_mask([-0.5, -0.25], stored_mask=[0, 1, 1, 1, 1], used_mask=[0, 0, 0, 1, 1])
    assert laid is not None and all(math.isnan(x) for x in laid[:2]) and laid[2:] == [-0.5, -0.25]


def test_rows_stored_before_per_token_versions_stay_readable(tmp_path: Path) -> None:
    """A data dir from before: no token_versions / max_policy_version columns; its samples read back with
    their trained tokens at the sample's oldest version, its episodes with no newest version."""
    path = tmp_path / "store.sqlite"
    store = SQLiteStore(path)
    s = sample([NO_VERSION, 2, 2], [0, 1, 1])
    store.commit_episode(episode(2, 2), [s], {})
    store.close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE samples DROP COLUMN token_versions")
    db.execute("ALTER TABLE episodes DROP COLUMN max_policy_version")
    db.commit()
    db.close()
    store = SQLiteStore(path)  # adds the columns back, empty
    got = store.samples_for(["e"])["e"][0]
    assert got.token_versions is None and got.versions == [NO_VERSION, 2, 2]
    ep = store.get_episode("e")
    assert ep is not None and ep.max_policy_version is None and ep.newest_version == 2
    store.close()


def test_a_reply_spanning_an_update_is_trained_on_its_fresh_tokens_and_traced(make_server, tiny_model_path) -> None:
    engine = null_engine(AutoTokenizer.from_pretrained(tiny_model_path), reply="one two three four",
                        update_at_token=2)
    srv = make_server(engine, admin_token="adm1n",
                      training={"group_size": 2, "batch_groups": 1, "max_staleness": 0, "admission": False})

    async def main() -> list[str]:
        ids = []
        async with SwarmClient(srv.url) as client:
            for reward in (1.0, 0.0):
                async with client.episode(task_id="t") as ep:
                    await ep.openai().chat.completions.create(model="tiny", messages=USER)
                    ep.reward(reward)
                ids.append(ep.episode_id)
                engine.generator.update_at_token = None  # only the first reply spans an update (v0 -> v1)
        return ids

    spanning, fresh = asyncio.run(main())
    wait_until(lambda: srv.server.counters.training.train_steps == 1)
    n = len(engine.generator.reply_ids)
    batch = engine.learner.trained[-1]
    masks = sorted((s.loss_mask[-n:] for s in batch), key=sum)
    assert masks == [[0, 0] + [1] * (n - 2), [1] * n]  # the two v0 tokens masked out, the rest trained
    metrics = srv.server.counters.training.last_metrics
    assert metrics["staleness/masked_tokens"] == 2 and metrics["staleness/masked_token_share"] == 2 / (2 * n)
    assert srv.server.status().buffer.dropped_stale_episodes == 0

    trace = httpx.get(f"{srv.url}/swarm/v1/episodes/{spanning}/trace",
                      headers={"Authorization": "Bearer adm1n"}).json()
    s = trace["samples"][0]
    start = s["calls"][0]["generated"][0]
    assert s["versions"][start:] == [0, 0] + [1] * (n - 2) and s["versions"][0] is None
    assert s["version_changes"] == [{"index": start + 2, "from": 0, "to": 1}]
    other = httpx.get(f"{srv.url}/swarm/v1/episodes/{fresh}/trace", headers={"Authorization": "Bearer adm1n"}).json()
    assert other["samples"][0]["version_changes"] == []
