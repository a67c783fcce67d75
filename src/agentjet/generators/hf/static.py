"""Static batching (``generator.batching: static``, the embedded engine's earlier path, and the fallback for a
model the slot KV cache cannot serve): the request batcher (``batcher.py``) gathers concurrent calls and
``StaticGenerator`` (``generation.py``) runs each batch to its longest request, on the worker thread. A request
that cannot be prepared fails alone; a batch that fails is run again request by request (``batcher.py``)."""

from __future__ import annotations

from typing import Any

from agentjet.engines.base import GenerationError, GenerationResult, SamplingParams, TokenCallback
from agentjet.engines.model import PolicyModel
from agentjet.generators.hf.base import HFGenerator, adapters_need_continuous
from agentjet.generators.hf.batcher import Request, RequestBatcher
from agentjet.generators.hf.generation import StaticGenerator
from agentjet.settings import GeneratorSettings


class StaticHFGenerator(HFGenerator):
    """The embedded generator with static batching: one policy (named LoRA adapters are refused)."""

    batching = "static"

    def __init__(self, policy: PolicyModel, settings: GeneratorSettings | None = None) -> None:
        if policy.adapters:
            raise adapters_need_continuous(policy.adapters, "generator.batching is 'static'")
        super().__init__(policy, settings)
        self.generator = StaticGenerator(self.model, self.rules, self.device)
        self.batcher = RequestBatcher(self._run_batch, self.settings.max_batch_size,
                                      self.settings.batch_wait_ms / 1000)

    @property
    def stats(self) -> dict[str, Any]:
        return {**self.generator.stats, **self.batcher.stats}

    async def _submit(self, prompt_ids: list[int], sampling: SamplingParams, on_token: TokenCallback | None,
                      adapter: str | None) -> GenerationResult:
        return await self.batcher.submit(prompt_ids, sampling, on_token)  # ``adapter`` is None: checked before

    async def _run_batch(self, reqs: list[Request]) -> list[GenerationResult | Exception]:
        return await self.worker.run(self._run_batch_sync, reqs)

    def _run_batch_sync(self, reqs: list[Request]) -> list[GenerationResult | Exception]:
        out: list[GenerationResult | Exception | None] = [None] * len(reqs)
        rows, where = [], []
        for i, r in enumerate(reqs):
            try:
                rows.append(self.generator.prepare(r, self.policy_version))
                where.append(i)
            except GenerationError as exc:  # this request alone
                out[i] = exc
        if rows:
            for i, res in zip(where, self.generator.generate_batch(rows, self.policy_version), strict=True):
                out[i] = res
        return [r for r in out if r is not None]

    async def close(self) -> None:
        await self.batcher.close()
        await super().close()
