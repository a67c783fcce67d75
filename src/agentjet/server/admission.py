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
groups, none of which can ever complete. The members a begun group still lacks hold their places: the capacity
left for new groups is the rule's, less those :func:`reserved` places. A place is held for ``group_timeout_s``
after its group's admission, no longer (a member that never comes, say its client was killed, does not keep it).

**Held begins.** A ``begin`` beyond capacity is held on the server (:class:`AdmissionQueue`, a long poll) until
its group fits, for at most ``training.admission_wait_s`` (or the request's shorter ``wait_s``); only then is
it answered 429 ``at_capacity``, and a client that asks not to wait (``wait_s: 0``) gets the 429 at once. Held
groups are admitted oldest first, each with all of its members that are waiting, in one pass: no other begin
runs between the capacity check and the members' episodes. A group whose task type is ahead of its cocktail
share is passed over (it keeps its place) so that the other types are not blocked behind it. A held request
whose client goes away leaves the queue and nothing else; one that was admitted as its client went away has its
episode aborted at once, so its place is free again.
"""

from __future__ import annotations

import asyncio
import enum
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar


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


def reserved(begun_by_group: Iterable[int], group_size: int) -> int:
    """Places held for the members that begun groups still lack (``begun`` open or pending per group)."""
    return sum(-b % group_size for b in begun_by_group)


class Decision(enum.Enum):
    ADMIT = "admit"  # the waiter's group fits (or is already begun): begin it now
    PASS = "pass"  # not this group now (its task type is ahead of its share): look at the next group
    BLOCK = "block"  # no capacity: nothing behind it may go first


R = TypeVar("R")  # a begin request
A = TypeVar("A")  # what an admitted waiter gets (the begin response)


@dataclass
class Waiter(Generic[R, A]):
    request: R
    group_key: str
    deadline: float  # clock.monotonic() past which it is answered "at capacity"
    future: asyncio.Future[A] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class AdmissionQueue(Generic[R, A]):
    """Begins held until their group fits: groups in arrival order (of their first waiting member), members of a
    group together. Pure bookkeeping: the caller says what fits (``decide``) and what admitting means (``admit``,
    run synchronously for each member, so nothing can take the capacity in between)."""

    def __init__(self) -> None:
        self._groups: OrderedDict[str, deque[Waiter[R, A]]] = OrderedDict()

    def __len__(self) -> int:
        return sum(len(q) for q in self._groups.values())

    def groups(self) -> int:
        return len(self._groups)

    def join(self, request: R, group_key: str, deadline: float) -> Waiter[R, A]:
        waiter: Waiter[R, A] = Waiter(request, group_key, deadline)
        self._groups.setdefault(group_key, deque()).append(waiter)
        return waiter

    def leave(self, waiter: Waiter[R, A]) -> bool:
        """Take a waiter out (its client went away); False if it was already answered."""
        q = self._groups.get(waiter.group_key)
        if q is None or waiter not in q:
            return False
        q.remove(waiter)
        if not q:
            del self._groups[waiter.group_key]
        waiter.future.cancel()
        return True

    def release(self, decide: Callable[[R], Decision], admit: Callable[[R], A]) -> int:
        """Admit waiters, oldest group first, while they fit; returns how many were answered."""
        answered = 0
        for key in list(self._groups):
            q = self._groups[key]
            while q:
                decision = decide(q[0].request)
                if decision is Decision.BLOCK:
                    return answered
                if decision is Decision.PASS:
                    break
                waiter = q.popleft()
                answered += 1
                try:
                    waiter.future.set_result(admit(waiter.request))
                except Exception as exc:  # e.g. the client's own open-episode limit: answered with that error
                    waiter.future.set_exception(exc)
            if not q:
                del self._groups[key]
        return answered

    def expire(self, now: float, error: Callable[[R], Exception]) -> int:
        """Answer every waiter whose deadline passed with ``error``; returns how many."""
        expired = 0
        for key in list(self._groups):
            q = self._groups[key]
            for waiter in [w for w in q if w.deadline <= now]:
                q.remove(waiter)
                waiter.future.set_exception(error(waiter.request))
                expired += 1
            if not q:
                del self._groups[key]
        return expired
