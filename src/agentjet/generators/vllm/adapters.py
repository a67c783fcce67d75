"""One named LoRA adapter of a shared vLLM generator, seen as a ``Generator`` of its own, and the seam that
pushes that adapter alone.

``VLLMAdapterView(vllm, name)`` sends every request to vLLM under adapter ``name``'s current versioned LoRA name
(``<name>-v<version>``) and reads and writes that adapter's policy version. ``VLLMAdapterReload(settings, name)``
is ``VLLMReload`` for one adapter: after that adapter's step it exports the adapter alone, loads it under its next
versioned name, probes it against its learner and unloads the old name once idle; no other adapter moves. A
``ComposedEngine`` per adapter (``layouts/vllm_adapters.py``) joins the two with that adapter's learner, as
``layouts/adapters.py`` does for the embedded engine. The views own nothing: their owner closes vLLM once.
"""

from __future__ import annotations

from typing import Any

from agentjet.engines.base import GenerationResult, Generator, Learner, SamplingParams, TokenCallback
from agentjet.engines.errors import GenerationError
from agentjet.generators.vllm.engine import VLLMGenerator
from agentjet.generators.vllm.sync import VLLMReload
from agentjet.settings import VLLMSettings
from agentjet.weights.sync import WeightSync


class VLLMAdapterView(Generator):
    """Adapter ``name`` of the shared vLLM generator: its requests, its policy version; the shared tokenizer,
    context, capacity and halt (one vLLM process serves every adapter)."""

    def __init__(self, vllm: VLLMGenerator, name: str) -> None:
        if name not in vllm.adapter_versions:
            raise ValueError(f"no LoRA adapter {name!r} on this vLLM server: its adapters are "
                             f"{sorted(vllm.adapter_versions)}")
        self.vllm = vllm
        self.name = name

    @property  # the base class declares a plain attribute; here it reads and writes the adapter's entry
    def policy_version(self) -> int:
        """The version of this adapter's weights that serves its new requests (0 once it was removed)."""
        return self.vllm.adapter_versions.get(self.name, 0)

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        if self.name in self.vllm.adapter_versions:  # a removed adapter is not brought back by a late push
            self.vllm.adapter_versions[self.name] = version

    @property  # a failed push of any adapter halts the shared vLLM: every adapter's training stops
    def halted_reason(self) -> str | None:
        return self.vllm.halted_reason

    @halted_reason.setter
    def halted_reason(self, reason: str | None) -> None:
        if reason is not None:
            self.vllm.halt(reason)

    @property
    def tokenizer(self) -> Any:
        return self.vllm.tokenizer

    @property
    def max_context(self) -> int:
        return self.vllm.max_context

    @property
    def capacity(self) -> int:
        return self.vllm.capacity

    def engine_stats(self) -> dict[str, Any]:
        return {**self.vllm.engine_stats(), "adapter": self.name, "policy_version": self.policy_version}

    def describe(self) -> dict[str, Any]:
        return {**self.vllm.describe(), "adapter": self.name, "lora_name": self.vllm.launch.adapters.get(
            self.name, ("", None))[0]}

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None, adapter: str | None = None) -> GenerationResult:
        """Generate with this view's adapter (``adapter``, when given, must be the same name)."""
        if adapter is not None and adapter != self.name:
            raise GenerationError(f"this engine generates with LoRA adapter {self.name!r}, not {adapter!r}",
                                  param="model")
        return await self.vllm.generate(prompt_ids, sampling, on_token, adapter=self.name)

    async def close(self) -> None:
        """Nothing: the shared vLLM generator is closed once, by its owner (``VLLMAdapters.close``)."""


class VLLMAdapterReload(WeightSync[Learner, VLLMAdapterView]):
    """``VLLMReload`` for one named adapter: the view's adapter is exported, loaded under its next versioned name
    and probed; a failure halts the shared vLLM as ``VLLMReload`` does."""

    transport = "safetensors"

    def __init__(self, settings: VLLMSettings, adapter: str) -> None:
        super().__init__(settings.sync_timeout_s)
        self.reload = VLLMReload(settings, adapter=adapter)

    async def push(self, learner: Learner, generator: VLLMAdapterView) -> dict[str, float]:
        """The inner seam's push on the shared generator (its own deadline, halt and resume)."""
        return await self.reload.push(learner, generator.vllm)

    async def _push(self, learner: Learner, generator: VLLMAdapterView) -> dict[str, float]:
        return await self.reload._push(learner, generator.vllm)  # unused: push delegates whole
