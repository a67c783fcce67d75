"""One named LoRA adapter of a shared embedded generator, seen as a ``Generator`` of its own.

``AdapterGenerator(hf, name)`` routes every request to adapter ``name`` of ``hf`` (a ``ContinuousHFGenerator``
built with named adapters, whose batches mix adapters) and reads and writes that adapter's policy version, so a
``ComposedEngine`` per adapter (``layouts/adapters.py``) composes it with the learner of that adapter exactly as
the single-process layout composes the whole generator. It owns nothing: ``close`` leaves the shared generator
running (its owner closes it once).
"""

from __future__ import annotations

from typing import Any

from agentjet.engines.base import GenerationResult, Generator, SamplingParams, TokenCallback
from agentjet.engines.errors import GenerationError
from agentjet.generators.hf.continuous import ContinuousHFGenerator


class AdapterGenerator(Generator):
    """Adapter ``name`` of the shared generator ``hf``: its requests, its policy version; the shared tokenizer,
    context and capacity (the slots are shared by every adapter)."""

    def __init__(self, hf: ContinuousHFGenerator, name: str) -> None:
        if name not in hf.adapter_versions:
            raise ValueError(f"no LoRA adapter {name!r} on this engine: its adapters are {sorted(hf.adapter_versions)}")
        self.hf = hf
        self.name = name

    @property  # the base class declares a plain attribute; here it reads and writes the adapter's entry
    def policy_version(self) -> int:
        """The version of this adapter's weights that serves its new requests (0 once it was removed)."""
        return self.hf.adapter_versions.get(self.name, 0)

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        if self.name in self.hf.adapter_versions:  # a removed adapter is not brought back by a late push
            self.hf.adapter_versions[self.name] = version

    @property
    def tokenizer(self) -> Any:
        return self.hf.tokenizer

    @property
    def max_context(self) -> int:
        return self.hf.max_context

    @property
    def capacity(self) -> int:
        return self.hf.capacity

    def describe(self) -> dict[str, Any]:
        return {**self.hf.describe(), "adapter": self.name}

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None, adapter: str | None = None) -> GenerationResult:
        """Generate with this view's adapter (``adapter``, when given, must be the same name)."""
        if adapter is not None and adapter != self.name:
            raise GenerationError(f"this engine generates with LoRA adapter {self.name!r}, not {adapter!r}",
                                  param="model")
        return await self.hf.generate(prompt_ids, sampling, on_token, adapter=self.name)

    async def close(self) -> None:
        """Nothing: the shared generator is closed once, by its owner (``AdapterEngines.close``)."""
