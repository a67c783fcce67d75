"""Sampling clients: frozen snapshots of training clients (each an adapter of its own) or the base, and ``sample``."""

from __future__ import annotations

import asyncio
import math
import uuid
from dataclasses import dataclass, replace
from typing import Any

from agentjet.engines.base import FinishReason, SamplingParams
from agentjet.engines.errors import GenerationError
from agentjet.learners.inprocess import InProcessLearner
from agentjet.learners.tinker_ops import copy_adapter, prompt_logprobs, prompt_topk
from agentjet.server.tinker.errors import TinkerError
from agentjet.server.tinker.models import TinkerModel, TinkerModels

# unnamed snapshots (save_weights_and_get_sampling_client) kept per training client; older ones are freed
KEEP_SNAPSHOTS = 4
BASE_ADAPTER = "tinker-base"  # a rank-1 adapter at zero: the base's outputs, for create_sampling_client(base_model)


@dataclass
class Sampler:
    """A sampling session: the adapter it samples (a frozen snapshot of a training client, or the base)."""

    sampler_id: str
    adapter: str
    base_model: str
    model_path: str | None = None
    owner: str | None = None  # the training client it snapshots


@dataclass
class SampledSequence:
    tokens: list[int]
    logprobs: list[float]
    stop: bool
    topk: list[list[tuple[int, float]]] | None = None  # per sampled token, the k likeliest (topk_sample_logprobs)


@dataclass
class SampleResult:
    sequences: list[SampledSequence]
    prompt_logprobs: list[float] | None  # len(prompt) values, the first NaN
    topk_prompt: list[list[tuple[int, float]]] | None = None  # len(prompt) rows, the first empty (no prediction)


class Samplers:
    """The sampling sessions by id, and the named sampler paths (``tinker://<adapter>/sampler_weights/<name>``)."""

    def __init__(self, models: TinkerModels) -> None:
        self.models = models
        self.live: dict[str, Sampler] = {}
        self.paths: dict[str, str] = {}  # tinker://... sampler path -> sampler id

    async def snapshot(self, model: TinkerModel, name: str | None) -> dict[str, Any]:
        """A frozen snapshot of the client's adapter as an adapter of its own (later steps leave it as it is)."""
        adapters = self.models.need_adapters()
        learner = self.models.learner(model)
        snap = self.models.new_name("snap")
        await adapters.add(snap, model.rank, unembed=model.unembed)
        await learner.worker.run(copy_adapter, learner, model.adapter, snap)
        path = f"tinker://{model.adapter}/sampler_weights/{name}" if name else None
        sampler = Sampler(f"sampler-{snap}", snap, model.base_model, path, model.model_id)
        self.live[sampler.sampler_id] = sampler
        if path is not None:
            old = self.paths.get(path)
            self.paths[path] = sampler.sampler_id
            if old is not None:
                await self.drop(old)
        else:
            mine = [x for x in self.live.values() if x.owner == model.model_id and x.model_path is None]
            for stale in mine[:-KEEP_SNAPSHOTS]:
                await self.drop(stale.sampler_id)
        return {"type": "save_weights_for_sampler", "path": path, "sampling_session_id": sampler.sampler_id}

    async def drop(self, sampler_id: str) -> None:
        sampler = self.live.pop(sampler_id, None)
        adapters = self.models.adapters
        if sampler is not None and adapters is not None and sampler.adapter in adapters.names():
            await adapters.remove(sampler.adapter)

    async def drop_snapshots_of(self, model_id: str) -> None:
        """A training client's unnamed snapshots (its named ones live for the server's run)."""
        for sampler in [x for x in self.live.values() if x.owner == model_id and x.model_path is None]:
            await self.drop(sampler.sampler_id)

    async def create(self, model_path: str | None, base_model: str | None) -> Sampler:
        if model_path:
            sid = self.paths.get(model_path)
            if sid is None:
                raise TinkerError(f"unknown sampler path {model_path!r}: save_weights_for_sampler(name) first", 404)
            return self.live[sid]
        self.models.check_base(base_model)
        adapters = self.models.need_adapters()
        if BASE_ADAPTER not in adapters.names():
            await adapters.add(BASE_ADAPTER, 1)
        sampler = Sampler(f"sampler-base-{uuid.uuid4().hex[:8]}", BASE_ADAPTER, self.models.served_name)
        self.live[sampler.sampler_id] = sampler
        return sampler

    def get(self, sampler_id: str) -> Sampler:
        s = self.live.get(sampler_id)
        if s is None:
            raise TinkerError(f"unknown sampling session {sampler_id!r} (freed: a training client keeps its last "
                              f"{KEEP_SNAPSHOTS} unnamed snapshots)", 404)
        return s

    async def sample(self, sampler: Sampler, prompt: list[int], num_samples: int, params: SamplingParams,
                     want_prompt_logprobs: bool, last_n: int | None = None, topk_prompt: int = 0) -> SampleResult:
        """``num_samples`` sequences (seed i: ``seed + i``); with ``want_prompt_logprobs`` the prompt's logprobs,
        with ``topk_prompt`` its top-k at each position; ``last_n``: only the last n positions of either scored."""
        adapters = self.models.need_adapters()
        if sampler.adapter not in adapters.names():
            raise TinkerError(f"sampling session {sampler.sampler_id!r} was freed", 404)
        engine = adapters.engine(sampler.adapter)
        vocab = len(engine.tokenizer)
        if not prompt or any(not 0 <= t < vocab for t in prompt):
            raise TinkerError(f"the prompt must be non-empty token ids in 0..{vocab - 1}")
        seeds = [None if params.seed is None else (params.seed + i) % (2**31) for i in range(num_samples)]
        try:
            # routed by the sampling client, as an episode's calls are by their episode (a fleet of replicas)
            results = await asyncio.gather(*(engine.generate(prompt, replace(params, seed=seed), adapter=sampler.adapter,
                                                             session=sampler.sampler_id)
                                              for seed in seeds))
        except GenerationError as e:
            raise TinkerError(str(e)) from e
        plp: list[float] | None = None
        topk: list[list[tuple[int, float]]] | None = None
        if want_prompt_logprobs or topk_prompt:
            learner = engine.learner
            if not isinstance(learner, InProcessLearner):
                raise TinkerError("prompt logprobs need the in-process learner")
            scored = (lambda i: i >= len(prompt) - last_n) if last_n is not None else (lambda i: True)
            if want_prompt_logprobs:
                plp = [math.nan, *await learner.worker.run(prompt_logprobs, learner, prompt)]
                plp = [x if scored(i) else math.nan for i, x in enumerate(plp)]
            if topk_prompt:
                rows = [[], *await learner.worker.run(prompt_topk, learner, prompt, topk_prompt)]
                topk = [row if i > 0 and scored(i) else [] for i, row in enumerate(rows)]
        return SampleResult([SampledSequence(
            list(r.token_ids), list(r.logprobs), r.finish_reason is FinishReason.STOP,
            [list(top) for top in r.top_logprobs] if params.top_logprobs and r.top_logprobs is not None else None)
            for r in results], plp, topk)
