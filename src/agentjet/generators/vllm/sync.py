"""The safetensors seam to vLLM: the learner exports the new version (an untied model directory, or a LoRA
adapter), vLLM reloads it in place (pause -> reload -> reset prefix cache -> resume) or loads the adapter under a
new name, and a fixed probe is re-scored by vLLM and by the learner: a disagreement above ``probe_threshold``
stops training (stale or half-loaded weights are caught, not trained on). A push that times out
(``sync_timeout_s``) or fails stops training too, after vLLM is resumed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from agentjet.engines.base import Learner
from agentjet.engines.errors import TrainingHaltedError
from agentjet.generators.vllm.client import VLLMError
from agentjet.generators.vllm.engine import VLLMGenerator
from agentjet.generators.vllm.process import ProcessStartError
from agentjet.settings import VLLMSettings
from agentjet.weights.sync import WeightSync, WeightSyncTimeout


class VLLMReload(WeightSync[Learner, VLLMGenerator]):
    """``adapter``: the named LoRA adapter this seam pushes (``layouts/vllm_adapters.py``): its export is loaded
    as ``<adapter>-v<version>`` and moves only that adapter's served version; None, the generator's one policy."""

    transport = "safetensors"

    def __init__(self, settings: VLLMSettings, adapter: str | None = None) -> None:
        super().__init__(settings.sync_timeout_s)
        self.dtype = settings.dtype if settings.dtype != "auto" else None
        self.adapter = adapter

    async def push(self, learner: Learner, generator: VLLMGenerator) -> dict[str, float]:
        version = learner.policy_version
        try:
            return await super().push(learner, generator)
        except WeightSyncTimeout as exc:
            await generator.swaps.best_effort_resume()
            generator.halt(f"the weight sync to policy v{version} did not finish within {self.timeout_s:.0f}s "
                           "(sync_timeout_s); vLLM may still serve the old weights")
            raise TrainingHaltedError(generator.halted_reason or "") from exc
        except (VLLMError, ProcessStartError) as exc:
            await generator.swaps.best_effort_resume()
            generator.halt(f"the weight sync to policy v{version} failed: {exc}")
            raise TrainingHaltedError(generator.halted_reason or "") from exc
        finally:
            generator.gate.set(True)

    async def _push(self, learner: Learner, generator: VLLMGenerator) -> dict[str, float]:
        version = learner.policy_version
        t0 = time.perf_counter()
        if generator.uses_lora:
            path = await learner.export_adapter()
        else:
            path = await learner.export_weights(self.dtype)
        export_s = time.perf_counter() - t0
        if self.adapter is not None:
            metrics = await generator.swaps.adapter(path, version, learner.score, slot=self.adapter,
                                                    on_served=_adapter_version_setter(generator, self.adapter))
        elif generator.uses_lora:
            metrics = await generator.swaps.adapter(path, version, learner.score)
        else:
            metrics = await generator.swaps.full(path, version, learner.score)
        return {**metrics, "export_seconds": export_s, "vllm_restarts": float(generator.process.counters.restarts)}


def _adapter_version_setter(generator: VLLMGenerator, adapter: str) -> Callable[[int], None]:
    """Record ``adapter``'s served version (not once it was removed: a late push does not bring it back)."""
    def set_version(version: int) -> None:
        if adapter in generator.adapter_versions:
            generator.adapter_versions[adapter] = version

    return set_version
