"""Admission within the staleness bound (AReaL's capacity rule, also used by SkyRL).

A rollout begun now can be trained no earlier than the step that consumes everything accepted before it. With a
batch of ``B`` episodes per step and at most ``max_staleness`` versions of lag, the swarm may hold

    capacity = min(max_concurrent - running, (max_staleness + version + 1) * B - (accepted + running))

more episodes, where ``running`` are open training episodes and ``accepted`` those acknowledged and kept
(trained or pending; dropped ones do not count, so a swarm whose groups are all skipped as uniform is never
shut out). Beyond it a new episode would most likely be dropped as too stale, so ``begin`` answers 429 with
``Retry-After`` and the client waits for its turn. Eval episodes are never trained and are not limited.

Training takes whole GRPO groups, so admission does too: an episode that joins a group already begun (fewer
than ``group_size`` of its episodes open or pending) is always admitted, and a new group is admitted only when
the capacity holds all of it. Admitting single episodes would deadlock: capacity spread over several half-begun
groups, none of which can ever complete.
"""

from __future__ import annotations


def capacity(*, version: int, batch_episodes: int, max_staleness: int, accepted: int, running: int,
             max_concurrent: int | None) -> int:
    """How many more training episodes may begin now (<= 0: none)."""
    by_staleness = (max_staleness + version + 1) * batch_episodes - (accepted + running)
    if max_concurrent is None:
        return by_staleness
    return min(max_concurrent - running, by_staleness)


def admits(*, capacity_now: int, group_size: int, begun_in_group: int) -> bool:
    """Whether an episode may begin: it completes a group already begun, or its new group fits whole."""
    if begun_in_group % group_size:
        return True
    return capacity_now >= group_size
