"""Adapters added and removed while the server runs (``ajet ctl adapter add|remove``, and the Tinker API's training
clients): each change happens between train steps (under the loop's ``step_lock``), so no step sees half of it.

- **add**: the engine gets a fresh adapter (its own rank, or the server's), a lane is built for it (its pool loads
  what the store holds for it: an adapter removed and added again takes up its pending episodes), the router
  sends its agent to it, and the loop steps it from the next pass.
- **remove**: the loop stops stepping it and the router stops routing to it (its agent gets the 404, or the
  default adapter), then the engine drops its weights. Its pending episodes stay in the store, pending for it.
  The default adapter and the last adapter cannot be removed.

An adapter added at run time lives until the server stops: to keep it across a restart, name it in ``--adapters``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from agentjet.engines.base import AdapterSet
from agentjet.server.errors import APIError, bad_request, conflict
from agentjet.server.training.lanes import AdapterRouter, Lane
from agentjet.server.training.loop import TrainLoop
from agentjet.settings.learner import check_adapter_name

log = logging.getLogger(__name__)

MAX_RANK = 1024  # learner.lora.rank's bound


class AdapterLanes:
    """The adapters of a running server, as lanes of its one train loop."""

    def __init__(self, adapters: AdapterSet, router: AdapterRouter, loop: TrainLoop,
                 make_lane: Callable[[str], Lane]) -> None:
        self.adapters = adapters
        self.router = router
        self.loop = loop
        self.make_lane = make_lane

    def names(self) -> list[str]:
        return list(self.router.lanes)

    async def add(self, name: str, rank: int | None = None) -> Lane:
        try:
            check_adapter_name(name)
        except ValueError as exc:
            raise bad_request(str(exc), param="name") from exc
        if rank is not None and not 1 <= rank <= MAX_RANK:
            raise bad_request(f"rank must be in [1, {MAX_RANK}] (got {rank})", param="rank")
        async with self.loop.step_lock:
            if name in self.router.lanes:
                raise conflict(f"adapter {name!r} exists already", "adapter_exists")
            try:
                await self.adapters.add(name, rank)
            except ValueError as exc:  # the engine's own refusal (e.g. a rank over vLLM's --max-lora-rank)
                raise bad_request(str(exc), param="rank") from exc
            lane = self.make_lane(name)
            pending = lane.pool.load_pending()
            self.loop.add_lane(lane)
            self.router.lanes[name] = lane
        log.info("adapter %s added (rank %s; %d pending episodes for it)", name, rank or "default", pending)
        self.loop.wake()
        return lane

    async def remove(self, name: str) -> None:
        async with self.loop.step_lock:
            if name not in self.router.lanes:
                raise _not_found(name, self.names())
            if name == self.router.default:
                raise conflict(f"adapter {name!r} is the default adapter; it cannot be removed", "adapter_is_default")
            if len(self.router.lanes) == 1:
                raise conflict(f"adapter {name!r} is the last one; it cannot be removed", "last_adapter")
            self.loop.remove_lane(name)
            del self.router.lanes[name]
            await self.adapters.remove(name)
        log.info("adapter %s removed", name)


def _not_found(name: str, names: list[str]) -> APIError:
    return APIError(404, f"no adapter {name!r}; the adapters are {', '.join(names)}", param="name",
                    code="adapter_not_found")
