"""The engine of continuous batching: the model, its slot KV cache and the decode step (``SlotRunner``,
``runner.py``) and the scheduler that refills the slots between decode steps (``ContinuousScheduler``,
``scheduler.py``), all driven by the one worker thread.

Its surface takes and gives data only: token ids, sampling parameters and an adapter name in; the (token, logprob)
stream and a ``GenerationResult`` out; adapters added and removed by name; counters and a description. The policy
version stamped on each token comes from ``version_of(adapter)``, read once per prefill and decode step. In the
engine-process layout (``engine_process/``) the whole ``ContinuousHFGenerator`` in front of it (its versions, its
``load_weights``, its worker thread) runs in the engine process, and the same data crosses the socket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentjet.engines.base import GenerationError, GenerationResult, SamplingParams, TokenCallback
from agentjet.engines.model import PolicyModel, add_lora_adapter
from agentjet.engines.worker import EngineWorker
from agentjet.generators.hf.prefix_cache import PrefixCache
from agentjet.generators.hf.rows import RowRules
from agentjet.generators.hf.runner import SlotRunner
from agentjet.generators.hf.scheduler import ContinuousScheduler
from agentjet.settings import GeneratorSettings


class SlotEngine:
    """The model, the slot KV cache, the decode step and the scheduler, on ``worker``'s thread."""

    def __init__(self, policy: PolicyModel, settings: GeneratorSettings, max_context: int, rules: RowRules,
                 worker: EngineWorker, version_of: Callable[[str | None], int]) -> None:
        mixed = bool(policy.adapters)
        self.model = policy.model
        self.lora = policy.lora
        self.compile = settings.compile and not mixed  # a mixed-adapter batch runs eagerly
        self.prefixes = (PrefixCache(settings.prefix_cache_tokens, lambda: worker.changes)
                         if settings.prefix_cache_tokens else None)
        self.runner = SlotRunner(policy.model, policy.causal_lm.config, policy.device, policy.dtype,
                                 settings.max_batch_size, settings.kv_cache_tokens, max_context, policy.pad_id,
                                 cuda_graphs=settings.cuda_graphs, compile=settings.compile, mixed_adapters=mixed,
                                 prefixes=self.prefixes)
        self.scheduler = ContinuousScheduler(worker, self.runner, rules, version_of, settings.batch_wait_ms / 1000)

    async def submit(self, prompt_ids: list[int], sampling: SamplingParams, on_token: TokenCallback | None,
                     adapter: str | None) -> GenerationResult:
        return await self.scheduler.submit(prompt_ids, sampling, on_token, adapter)

    @property
    def stats(self) -> dict[str, Any]:
        return {**self.scheduler.stats, **self.runner.stats, **(self.prefixes.stats if self.prefixes else {})}

    def describe(self) -> dict[str, Any]:
        prefixes = self.prefixes
        return {"kv_cache_tokens": self.runner.capacity, "cuda_graphs": self.runner.use_graphs,
                "compile": self.compile,
                "prefix_cache": None if prefixes is None else
                {"budget_tokens": prefixes.budget, "kept_tokens": prefixes.tokens, "entries": prefixes.entries}}

    @property
    def mixed_batches(self) -> str | None:
        """How rows of different adapters share a forward (None: the model has no named adapters)."""
        return self.runner.adapters.mixed_batches

    # ------------------------------------------------------------------ adapters (on the worker thread)
    def add_adapter(self, name: str, rank: int | None, unembed: bool) -> None:
        assert self.lora is not None
        add_lora_adapter(self.model, name, self.lora, rank, unembed)
        self.runner.adapters.refresh()

    def remove_adapter(self, name: str, fallback: str) -> None:
        """Fail ``name``'s queued and running requests, then delete its weights (``fallback`` becomes the active
        adapter if ``name`` was)."""
        self.scheduler.drop_adapter(name, GenerationError(f"LoRA adapter {name!r} was removed while its request "
                                                          "was generating", param="model"))
        if name in self.model.active_adapters:
            self.model.set_adapter(fallback)
        self.model.delete_adapter(name)
        self.runner.adapters.refresh()
