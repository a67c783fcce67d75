"""The weight-sync seam: after a learner's step, bring its generator to the new weights. One seam per
(generator, learner) pair, chosen where the layout is composed (``agentjet.layouts``):

| generator | learner    | seam                                                                     |
|-----------|------------|--------------------------------------------------------------------------|
| embedded  | in process | :class:`InPlace`: they share the module; only the version moves          |
| embedded  | group      | ``generators.hf.sync.CopyIntoModule``: the export is copied into it      |
| vLLM      | either     | ``generators.vllm.sync.VLLMReload`` (safetensors + reload + probe), or    |
|           |            | ``generators.vllm.native_sync.VLLMNativeSync`` (NCCL; unverified on GPU)  |
| null      | null       | ``layouts.null.NullSync``: nothing moves but the version                 |

Every push has a deadline (``timeout_s``): a transfer that hangs fails the step's sync with
:class:`WeightSyncTimeout` instead of stalling training.
"""

from __future__ import annotations

import abc
import asyncio
import time
from typing import Generic, TypeVar

from agentjet.engines.base import Generator, Learner

L = TypeVar("L", bound=Learner)
G = TypeVar("G", bound=Generator)


class WeightSyncTimeout(TimeoutError):
    """A weight push did not finish within its deadline."""


class WeightSync(abc.ABC, Generic[L, G]):
    """Brings ``generator`` to ``learner.policy_version``'s weights. Returns the push's metrics. Typed on the
    pair it serves (``WeightSync[Learner, VLLMGenerator]``), so a seam never downcasts its generator."""

    transport: str = "none"

    def __init__(self, timeout_s: float = 300.0) -> None:
        if not timeout_s > 0:
            raise ValueError("a weight sync needs a timeout > 0")
        self.timeout_s = timeout_s

    async def push(self, learner: L, generator: G) -> dict[str, float]:
        start = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                metrics = await self._push(learner, generator)
        except TimeoutError as exc:
            raise WeightSyncTimeout(f"the {self.transport} weight sync to policy v{learner.policy_version} did not "
                                    f"finish within {self.timeout_s:.0f} s") from exc
        return {**metrics, "sync_seconds": time.perf_counter() - start}

    @abc.abstractmethod
    async def _push(self, learner: L, generator: G) -> dict[str, float]: ...

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the transport holds (process groups, shared memory)."""


class InPlace(WeightSync[Learner, Generator]):
    """The generator and the learner share one module, updated in place by the step: nothing moves but the
    version the generator serves (the learner already moved it on the worker thread, in the step's own job:
    ``InProcessLearner(on_version=...)``; this keeps them equal for any other caller)."""

    transport = "in-place"

    async def _push(self, learner: Learner, generator: Generator) -> dict[str, float]:
        generator.policy_version = learner.policy_version
        return {}
