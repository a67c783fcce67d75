"""Timing and batching rules, tested without sockets or sleeps: the registry's leases and the group pool's
timeouts, absent task types, staleness and quota selection, all against a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentjet.protocol import BeginEpisodeRequest, EpisodeStatus
from agentjet.runtime.clock import FakeClock
from agentjet.server.counters import TrainingCounters
from agentjet.server.episodes.registry import EpisodeRegistry
from agentjet.server.store import SQLiteStore, StoredEpisode, StoredStatus
from agentjet.server.training.pool import GroupPool
from agentjet.settings import ServerConfig, TrainingSettings


def begin(reg: EpisodeRegistry, client: str = "c", task: str = "t") -> object:
    return reg.begin(BeginEpisodeRequest(client_id=client, task_id=task), policy_version=0)[0]


# ---------------------------------------------------------------------- leases
def test_lease_expires_only_after_lease_seconds_without_activity() -> None:
    clock = FakeClock()
    reg = EpisodeRegistry(lease_seconds=60, clock=clock)
    ep = begin(reg)
    clock.advance(59.9)
    assert reg.expire_due() == [] and reg.lease_remaining(ep) == pytest.approx(0.1)
    reg.touch(ep)  # a call or a heartbeat renews the lease
    clock.advance(59.9)
    assert reg.expire_due() == []
    clock.advance(0.2)
    assert reg.expire_due() == [ep] and ep.status is EpisodeStatus.EXPIRED
    assert reg.counts["expired"] == 1 and reg.open_count == 0 and reg.lease_remaining(ep) == 0


def test_a_call_in_flight_keeps_the_lease_alive() -> None:
    clock = FakeClock()
    reg = EpisodeRegistry(lease_seconds=10, clock=clock)
    ep = begin(reg)
    ep.inflight = 1
    clock.advance(1000)
    assert reg.expire_due() == []
    ep.inflight = 0
    assert reg.expire_due() == [ep]


def test_rejoin_releases_only_that_clients_episodes() -> None:
    reg = EpisodeRegistry(lease_seconds=10, clock=FakeClock())
    mine, other = begin(reg, "a"), begin(reg, "b")
    assert reg.release_client("a") == 1
    assert mine.status is EpisodeStatus.ABORTED and other.status is EpisodeStatus.OPEN


# ---------------------------------------------------------------------- the group pool's selection rules
@pytest.fixture
def config() -> ServerConfig:
    return ServerConfig(training=TrainingSettings(group_size=4, batch_groups=2, min_group_size=2,
                                                  group_timeout_s=120, max_staleness=2, absent_after_s=30))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def pool(tmp_path: Path, config: ServerConfig, clock: FakeClock) -> GroupPool:
    """The pool reads the config's live section afresh, as the server's does."""
    return GroupPool(lambda: config.training, SQLiteStore(tmp_path / "store.sqlite"), TrainingCounters(), clock)


_seq = iter(range(10**6))


def stored(pool: GroupPool, group: str, task_type: str = "default", version: int = 0, reward: float = 1.0
           ) -> StoredEpisode:
    ep = StoredEpisode(episode_id=f"ep-{next(_seq)}", key_hash="h", client_id="c", task_id=group,
                       task_type=task_type, group_key=group, reward=reward, status=StoredStatus.PENDING, n_calls=1,
                       n_samples=0, begin_policy_version=version, min_policy_version=version, ended_at=0.0)
    pool.store.commit_episode(ep, [], {})
    pool.add(ep)
    return ep


def test_incomplete_group_waits_for_its_timeout(pool: GroupPool, clock: FakeClock) -> None:
    for _ in range(3):
        stored(pool, "g")
    assert pool.candidate_groups() == []  # 3 of 4
    clock.advance(119)
    assert pool.candidate_groups() == []
    clock.advance(2)
    [g] = pool.candidate_groups()
    assert len(g.episodes) == 3


def test_timed_out_group_smaller_than_min_is_not_trained(pool: GroupPool, clock: FakeClock) -> None:
    stored(pool, "g")
    clock.advance(1000)
    assert pool.candidate_groups() == []


def test_full_groups_need_batch_groups_to_form_a_batch(pool: GroupPool) -> None:
    for _ in range(4):
        stored(pool, "a")
    assert pool.select_batch(pool.candidate_groups()) is None  # 1 of 2 groups
    for _ in range(4):
        stored(pool, "b")
    batch = pool.select_batch(pool.candidate_groups())
    assert batch is not None and [g.key for g in batch] == ["a", "b"]


def test_stale_episodes_are_dropped_and_counted(pool: GroupPool) -> None:
    old = stored(pool, "g", version=0)
    young = stored(pool, "g", version=1)
    pool.drop_stale(3)
    assert pool.counters.dropped_stale == 1
    assert pool.store.get_episode(old.episode_id).status is StoredStatus.DROPPED_STALE
    assert pool.store.get_episode(young.episode_id).status is StoredStatus.PENDING
    assert pool.pending_count == 1


def _cocktail(config: ServerConfig, policy: str) -> None:
    config.training = TrainingSettings.model_validate(
        {**config.training.model_dump(), "task_ratios": {"math": 0.5, "code": 0.5}, "absent_policy": policy})


@pytest.mark.parametrize("policy", ["strict", "fill"])
def test_quotas_compose_the_batch(pool: GroupPool, policy: str, config: ServerConfig) -> None:
    _cocktail(config, policy)
    for _ in range(8):
        stored(pool, "m1" if _ < 4 else "m2", "math")
    pool.note_begin("code")  # code clients are present, just slower
    assert pool.select_batch(pool.candidate_groups()) is None  # waits for code's share
    for _ in range(4):
        stored(pool, "c1", "code")
    batch = pool.select_batch(pool.candidate_groups())
    assert batch is not None and sorted(g.task_type for g in batch) == ["code", "math"]


def test_an_absent_type_is_filled_only_under_fill_and_only_after_absent_after_s(pool: GroupPool, clock: FakeClock,
                                                                              config: ServerConfig) -> None:
    _cocktail(config, "fill")
    pool.note_begin("code")
    for i in range(8):
        stored(pool, f"m{i // 4}", "math")
    assert pool.select_batch(pool.candidate_groups()) is None
    clock.advance(31)
    batch = pool.select_batch(pool.candidate_groups())
    assert batch is not None and [g.task_type for g in batch] == ["math", "math"]
    _cocktail(config, "strict")
    assert pool.select_batch(pool.candidate_groups()) is None  # strict waits however long
