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

The rules above are pure functions and a pure queue; ``Admission`` applies them to the server's begins, with
what refuses a begin whatever the capacity (the server's state, its store, the client's own limit) and the
cocktail quotas (a task type ahead of its share is deferred).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from agentjet.layouts.composed import ComposedEngine
from agentjet.protocol import BeginEpisodeRequest, BeginEpisodeResponse, EpisodeStatus
from agentjet.runtime.clock import Clock
from agentjet.server.counters import AdmissionCounters, TrainingCounters
from agentjet.server.episodes.registry import EpisodeRegistry
from agentjet.server.errors import APIError, bad_request, unavailable
from agentjet.server.state import Lifecycle, ServerState
from agentjet.server.store_health import StoreHealth
from agentjet.server.training.pool import GroupPool
from agentjet.settings import ServerConfig

log = logging.getLogger(__name__)

QUOTA_RETRY_MS = 500
CAPACITY_RETRY_MS = 250


class LaneView(NamedTuple):
    """What admission reads of one policy's training lane (``training/lanes.py``)."""

    engine: ComposedEngine
    pool: GroupPool


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
        return sum(map(len, list(self._groups.values())))  # one copy: the read side may count from a thread

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


class Admission:
    """The server's gate for ``begin``: what refuses a begin whatever the capacity (the server's state, its
    store, the client's own limit), the cocktail quotas, and the capacity rule above with its queue of held
    begins. Counts its refusals and held begins (``counters.AdmissionCounters``)."""

    def __init__(self, config: ServerConfig, engine: ComposedEngine, registry: EpisodeRegistry, pool: GroupPool,
                 clock: Clock, lifecycle: Lifecycle, store_health: StoreHealth, counters: AdmissionCounters,
                 training: TrainingCounters,
                 lanes: Callable[[Sequence[str] | None], Sequence[LaneView]] | None = None) -> None:
        """``lanes(agents)``: on a server with several LoRA adapters, the (engine, pool) of each adapter that the
        ``agents`` a begin declares may use (``None``: every adapter; an agent no adapter serves raises its 4xx).
        An episode counts against each of them: the capacity is the least of theirs, and a group's place is kept in
        every pool. By default the one ``engine`` and ``pool``."""
        self.config = config
        self._lanes_of = lanes or (lambda _agents: [LaneView(engine, pool)])
        self.training = training  # read only: the committed version, for the served version that tags evals
        self.engine = engine
        self.registry = registry
        self.pool = pool
        self.clock = clock
        self.lifecycle = lifecycle
        self.store_health = store_health
        self.counters = counters
        self.queue: AdmissionQueue[BeginEpisodeRequest, BeginEpisodeResponse] = AdmissionQueue()

    async def begin(self, req: BeginEpisodeRequest,
                    client_gone: Callable[[], Awaitable[object]] | None = None) -> BeginEpisodeResponse:
        """Begin an episode. A training episode beyond capacity is held until its group fits, for at most its
        wait, then answered 429 ``at_capacity``. ``client_gone`` returns when the client disconnects: a held
        begin then leaves the queue (or, admitted in that instant, is aborted)."""
        self._check_open(req)
        wait_s = self._wait_s(req)
        group_key = req.group_id or req.task_id
        self._lanes_of(req.agents)  # an agent no adapter serves: its 4xx now, not after a hold
        if req.eval or not self.config.training.admission or wait_s <= 0:
            if not req.eval:
                self._check_quota(req.task_type)
                self._check_capacity(group_key, req.agents)
            return self._admit(req)
        self._check_task_type(req.task_type)
        if self._begun_in_group(group_key) % self.config.training.group_size:
            return self._admit(req)  # its group is begun: its place is held
        waiter = self.queue.join(req, group_key, self.clock.monotonic() + wait_s)
        self.pump()
        if waiter.future.done():
            return waiter.future.result()
        self.counters.held_begin()
        gone = asyncio.ensure_future(client_gone()) if client_gone is not None else None
        try:
            watched: list[asyncio.Future[Any]] = [waiter.future, *([gone] if gone else [])]
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            if gone is not None and gone.done():  # (admitted in the same instant: _withdraw aborts it)
                raise APIError(499, "the client went away while its begin was held", code="client_gone")
            return waiter.future.result()
        except BaseException:
            self._withdraw(waiter)
            raise
        finally:
            if gone is not None:
                gone.cancel()

    def _withdraw(self, waiter: Waiter[BeginEpisodeRequest, BeginEpisodeResponse]) -> None:
        """A held begin ends without an answer reaching its client: out of the queue, or, if it was admitted in
        that instant, its episode aborted, so that no place stays taken by a client that is gone."""
        if self.queue.leave(waiter):
            self.pump()  # the head of the queue may have changed
            return
        fut = waiter.future
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            ep = self.registry.get(fut.result().episode_id)
            if ep is not None and ep.is_open:
                log.info("episode %s aborted: its client went away as it was admitted", ep.episode_id)
                self.registry.close(ep, EpisodeStatus.ABORTED)
                self.pump()

    def _wait_s(self, req: BeginEpisodeRequest) -> float:
        most = self.config.training.admission_wait_s
        return most if req.wait_s is None else min(req.wait_s, most)

    def _check_open(self, req: BeginEpisodeRequest) -> None:
        """What refuses a begin whatever the capacity: the server's state, its store, the client's own limit."""
        state = self.lifecycle.effective()
        if state is not ServerState.READY:
            raise unavailable(f"the server is {state.value}", "not_ready", retry_after_s=1)
        self.store_health.check()
        cap = self.config.max_open_episodes_per_client
        if self.registry.open_for_client(req.client_id) >= cap:
            raise APIError(429, f"client {req.client_id!r} already has {cap} open episodes (the limit); end or "
                           "abort some first", "rate_limit_error", code="too_many_open_episodes",
                           headers={"Retry-After": "1"})

    def _admit(self, req: BeginEpisodeRequest) -> BeginEpisodeResponse:
        lanes = self._lanes_of(req.agents)
        if not req.eval and not self._begun_in_group(req.group_id or req.task_id) % self.config.training.group_size:
            for lane in lanes:
                lane.pool.note_admitted(req.group_id or req.task_id)
        # a training episode's staleness counts from the learner's version; an eval is tagged with the version
        # that generates it, the served one (design §6), not a learner's version still being pushed (with several
        # adapters: the oldest of theirs)
        version = (self.training.served_version(self.engine.generator_version) if req.eval and len(lanes) == 1
                   else min(lane.engine.generator_version if req.eval else lane.engine.policy_version
                            for lane in lanes))
        ep, key = self.registry.begin(req, version)
        for lane in lanes:
            lane.pool.note_begin(req.task_type)
        base_url = self.config.base_url()
        return BeginEpisodeResponse(episode_id=ep.episode_id, api_key=key, base_url=base_url,
                                    lease_seconds=self.config.lease_seconds, policy_version=version,
                                    anthropic_base_url=base_url.removesuffix("/v1"), model=self.config.name)

    def _admit_held(self, req: BeginEpisodeRequest) -> BeginEpisodeResponse:
        self._check_open(req)
        return self._admit(req)

    def _decide(self, req: BeginEpisodeRequest) -> Decision:
        """For the queue: may this held begin go now?"""
        t = self.config.training
        if self._ahead_of_share(req.task_type):
            return Decision.PASS
        group_key = req.group_id or req.task_id
        if not t.admission or admits(capacity_now=self.capacity(req.agents) - self.reserved(),
                                     group_size=t.group_size, begun_in_group=self._begun_in_group(group_key)):
            return Decision.ADMIT
        return Decision.BLOCK

    def pump(self) -> None:
        """Capacity may have changed (an episode closed, a step trained, settings changed): admit what fits now,
        and answer the held begins whose wait is over."""
        state = self.lifecycle.effective()
        if state is not ServerState.READY:  # stopping: answer every held begin now
            self.queue.expire(math.inf, lambda _: unavailable(f"the server is {state.value}", "not_ready",
                                                              retry_after_s=1))
            return
        self.queue.expire(self.clock.monotonic(), self._held_too_long)
        self.queue.release(self._decide, self._admit_held)

    def _held_too_long(self, req: BeginEpisodeRequest) -> APIError:
        """The answer to a begin held for its whole wait: ask again at once (another long poll)."""
        if self._ahead_of_share(req.task_type):
            return self._deferred(req.task_type, 0)
        return self._refuse_at_capacity(0)

    def _deferred(self, task_type: str, retry_ms: int) -> APIError:
        share = self.config.training.task_ratios[task_type]
        return APIError(429, f"task type {task_type!r} is ahead of its share ({share} of each batch): retry after "
                        f"{retry_ms} ms", "rate_limit_error", param="task_type", code="deferred",
                        headers={"Retry-After": "1", "Retry-After-Ms": str(retry_ms)})

    def _refuse_at_capacity(self, retry_ms: int) -> APIError:
        """The 429 ``at_capacity`` answer (counted: ``AdmissionCounters.refusals``)."""
        self.counters.refused()
        return APIError(429, f"the swarm is at capacity for policy v{self.engine.policy_version}: an episode begun now "
                        f"would be more than max_staleness={self.config.training.max_staleness} versions old when "
                        f"trained; retry after {retry_ms} ms", "rate_limit_error", code="at_capacity",
                        headers={"Retry-After": "1", "Retry-After-Ms": str(retry_ms)})

    def _ahead_of_share(self, task_type: str) -> bool:
        """Cocktail training: a type that already has two batches' worth of its share in flight waits. Its share
        takes in the absent types' under the fill policy: else a type left alone (the others' clients gone, or
        all their groups dropped as uniform and their clients stuck on this type's deferrals) could never fill
        a batch, and would wait on itself."""
        settings = self.config.training
        if not settings.task_ratios or task_type not in settings.task_ratios:
            return False
        quota = max(self.pool.share_with_absent(task_type), 1) * settings.group_size
        outstanding = self.registry.open_by_type[task_type] + self.pool.pending_by_type().get(task_type, 0)
        return outstanding >= 2 * quota

    def _check_task_type(self, task_type: str) -> None:
        """Cocktail training: a type must have a ratio; one that asks to begin is present (not absent)."""
        settings = self.config.training
        if not settings.task_ratios:
            return
        if task_type not in settings.task_ratios:
            raise bad_request(f"task type {task_type!r} has no ratio; the server trains "
                              f"{sorted(settings.task_ratios)}", param="task_type")
        self.pool.note_begin(task_type)  # a deferred type is present, not absent

    def _check_quota(self, task_type: str) -> None:
        """Cocktail training: defer (429) a type that already has two batches' worth of its share in flight."""
        self._check_task_type(task_type)
        if self._ahead_of_share(task_type):
            raise self._deferred(task_type, QUOTA_RETRY_MS)

    def capacity(self, agents: Sequence[str] | None = None) -> int:
        """Training episodes that may begin now without going past the staleness bound (``capacity``), for an
        episode that will call ``agents`` (None: any). Every open training episode counts as running against each
        adapter (conservative: the registry does not know which adapters an open episode will use)."""
        t = self.config.training
        return min(capacity(version=lane.engine.policy_version, batch_episodes=t.batch_groups * t.group_size,
                            max_staleness=t.max_staleness, accepted=lane.pool.accepted_count,
                            running=self.registry.open_training, max_concurrent=t.max_concurrent)
                   for lane in self._lanes_of(agents))

    def _begun_in_group(self, group_key: str) -> int:
        return self.registry.open_by_group[group_key] + max(lane.pool.pending_in_group(group_key)
                                                            for lane in self._lanes_of(None))

    def reserved(self) -> int:
        """Places held for the members that begun groups still lack (``reserved``), for ``group_timeout_s``
        after the group's admission: a member that never comes (its client was killed) does not hold its place
        for longer."""
        t = self.config.training
        lanes = self._lanes_of(None)
        keys = set(self.registry.open_by_group).union(*(lane.pool.pending_group_keys() for lane in lanes))
        return reserved((self._begun_in_group(k) for k in keys
                         if any(lane.pool.admitted_within(k, t.group_timeout_s) for lane in lanes)),
                        t.group_size)

    def _check_capacity(self, group_key: str, agents: Sequence[str] | None = None) -> None:
        t = self.config.training
        if not t.admission or admits(capacity_now=self.capacity(agents) - self.reserved(), group_size=t.group_size,
                                     begun_in_group=self._begun_in_group(group_key)):
            return
        raise self._refuse_at_capacity(CAPACITY_RETRY_MS)
