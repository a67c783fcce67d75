"""The seam from a learner that exports weights to the embedded generator (``agentjet.weights.sync``): the learner
writes a model directory (safetensors, in ``/dev/shm`` when it has room); the generator copies it into its live
parameters in place, between decode steps: in this process (``HFGenerator``, beside a trainer group), or in its
engine process (``ProcessHFGenerator``, beside either learner)."""

from __future__ import annotations

import time

from agentjet.engines.base import Learner
from agentjet.generators.hf.base import HFGenerator
from agentjet.generators.hf.engine_process import ProcessHFGenerator
from agentjet.weights.sync import WeightSync


class CopyIntoModule(WeightSync[Learner, HFGenerator | ProcessHFGenerator]):
    transport = "safetensors"

    async def _push(self, learner: Learner, generator: HFGenerator | ProcessHFGenerator) -> dict[str, float]:
        t0 = time.perf_counter()
        path = await learner.export_weights()
        t1 = time.perf_counter()
        await generator.load_weights(path, learner.policy_version)
        return {"export_seconds": t1 - t0, "load_seconds": time.perf_counter() - t1}
