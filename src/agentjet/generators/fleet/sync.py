"""The fleet's weight-sync seam (``weights/sync.py``): after a step the learner exports its weights once, and the
fleet pushes them to every replica in rotation at once (``Slots.push``): each replica's push timed (its own
deadline: the fleet's ``push_timeout_s``), one that fails taken out of rotation and restarted, caught up before it serves again.
Training goes on: the step is committed whatever the pushes do, and the served version is the one every replica
in rotation holds. Only when no replica took the version does the push fail (the engine pushes again before the
next step)."""

from __future__ import annotations

import time

from agentjet.engines.base import Learner
from agentjet.generators.fleet.fleet import FleetGenerator
from agentjet.generators.fleet.replica import Weights
from agentjet.weights.sync import WeightSync

DEADLINE_MARGIN_S = 30.0  # the whole push's deadline: one replica's, plus this (the replicas are pushed at once)


class FleetSync(WeightSync[Learner, FleetGenerator]):
    """``replica_timeout_s``: one replica's push deadline (the fleet's); the whole push gets a margin more.
    ``probe``: give the replicas the learner's scorer, for replicas that check what they loaded (vLLM's probe);
    ``dtype``: the export's (a learner may ignore it); ``transport``: how the replicas take it, for the status."""

    transport = "fleet"

    def __init__(self, replica_timeout_s: float = 300.0, *, dtype: str | None = None, probe: bool = False,
                 transport: str = "safetensors") -> None:
        super().__init__(replica_timeout_s + DEADLINE_MARGIN_S)
        self.dtype = dtype
        self.probe = probe
        self.transport = f"fleet ({transport})"

    async def _push(self, learner: Learner, generator: FleetGenerator) -> dict[str, float]:
        t0 = time.perf_counter()
        path = await learner.export_weights(self.dtype)
        export_s = time.perf_counter() - t0
        weights = Weights(learner.policy_version, path, learner.score if self.probe else None)
        return {**await generator.push(weights), "export_seconds": export_s}
