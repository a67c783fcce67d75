"""Continuous batching (the default): the generator in front of a ``SlotEngine`` (``slot_engine.py``: the model,
the slot KV cache, the decode step and the scheduler that refills a fixed pool of slots between decode steps;
CUDA graphs on CUDA). The front checks each request (its adapter, its prompt), keeps the policy versions served
and the adapters' registry, and describes the engine; the engine does the torch work.

Named LoRA adapters (a ``PolicyModel`` built with ``adapters``, ``layouts/adapters.py``) run here only: every
request names its adapter (``generate(..., adapter=name)``), rows of different adapters share one batch (the
per-row LoRA of ``lora_rows.py``, or PEFT's mixed-batch forward; eagerly: no CUDA graphs or ``torch.compile``),
each adapter has its own policy version (``adapter_versions``), and adapters are added and removed between
decode steps (``add_adapter``, ``remove_adapter``).
"""

from __future__ import annotations

from typing import Any

from agentjet.engines.base import GenerationError, GenerationResult, SamplingParams, TokenCallback
from agentjet.engines.model import PolicyModel
from agentjet.generators.hf.base import HFGenerator, adapters_need_continuous
from agentjet.generators.hf.kv_cache import slot_cache_fits
from agentjet.generators.hf.slot_engine import SlotEngine
from agentjet.settings import GeneratorSettings


def _unservable(policy: PolicyModel, unfit: str) -> ValueError:
    if policy.adapters:
        return adapters_need_continuous(policy.adapters, f"the model has {unfit}")
    return ValueError(f"continuous batching cannot serve a model with {unfit} (the slot KV cache holds full-attention "
                      "layers only): set generator.batching to 'static' (--batching static)")


class ContinuousHFGenerator(HFGenerator):
    """The embedded generator with continuous batching; one policy, or named LoRA adapters mixed in one batch."""

    batching = "continuous"

    def __init__(self, policy: PolicyModel, settings: GeneratorSettings | None = None) -> None:
        unfit = slot_cache_fits(policy.causal_lm.config)
        if unfit is not None:  # hf_generator falls back to static batching before this
            raise _unservable(policy, unfit)
        super().__init__(policy, settings)
        # named LoRA adapters: each one's policy version (its keys are the adapters served now)
        self.mixed_adapters = bool(policy.adapters)
        self.adapter_versions: dict[str, int] = dict.fromkeys(policy.adapters, 0)
        self.core = SlotEngine(policy, self.settings, self._max_context, self.rules, self.worker, self.version_of)

    @property
    def stats(self) -> dict[str, Any]:
        return self.core.stats

    def describe(self) -> dict[str, Any]:
        info = {**super().describe(), **self.core.describe()}
        if self.mixed_adapters:
            info["adapters"] = dict(self.adapter_versions)
            info["mixed_adapter_batches"] = (f"{self.core.mixed_batches}, eager: CUDA graphs and torch.compile "
                                             "cannot capture it")
        return info

    async def _submit(self, prompt_ids: list[int], sampling: SamplingParams, on_token: TokenCallback | None,
                      adapter: str | None) -> GenerationResult:
        return await self.core.submit(prompt_ids, sampling, on_token, adapter)

    # ----------------------------------------------------------------- adapters
    def version_of(self, adapter: str | None) -> int:
        """The policy version that serves ``adapter``'s new tokens (None: the only policy). Raises
        ``GenerationError`` (``param="model"``) for an adapter this generator does not serve, naming those it
        does."""
        if not self.mixed_adapters:
            return super().version_of(adapter)
        if adapter is None:
            raise GenerationError(f"this engine serves LoRA adapters {sorted(self.adapter_versions)}: name one "
                                  "(the model)", param="model")
        version = self.adapter_versions.get(adapter)
        if version is None:
            raise GenerationError(f"no LoRA adapter {adapter!r} on this engine: its adapters are "
                                  f"{sorted(self.adapter_versions)}", param="model")
        return version

    async def add_adapter(self, name: str, rank: int | None = None, unembed: bool = False) -> None:
        """A fresh LoRA adapter (the learner's LoRA settings; its own ``rank`` when given; with ``unembed``, on the
        output layer too), served at version 0 from the next decode step on. Between decode steps, on the worker
        thread."""
        if not self.mixed_adapters:
            raise ValueError("this engine was not built with named LoRA adapters (layouts.adapter_engines)")
        await self.worker.run(self._add_adapter, name, rank, unembed)

    def _add_adapter(self, name: str, rank: int | None, unembed: bool) -> None:
        self.core.add_adapter(name, rank, unembed)
        self.adapter_versions[name] = 0

    async def remove_adapter(self, name: str) -> None:
        """Stop serving ``name`` and delete its weights, between decode steps: its queued and running requests
        fail with a ``GenerationError`` (``param="model"``), later ones are refused, the others go on. The last
        adapter cannot be removed (PEFT needs an active one)."""
        if name not in self.adapter_versions:
            raise ValueError(f"no LoRA adapter {name!r} to remove: the adapters are {sorted(self.adapter_versions)}")
        if len(self.adapter_versions) == 1:
            raise ValueError(f"adapter {name!r} is the last one: an engine keeps at least one adapter")
        await self.worker.run(self._remove_adapter, name)

    def _remove_adapter(self, name: str) -> None:
        self.adapter_versions.pop(name, None)  # from here, admission refuses its queued requests
        self.core.remove_adapter(name, fallback=next(iter(self.adapter_versions)))
