"""What both embedded generators share (``HFGenerator``): one copy of the weights (a ``PolicyModel``,
``engines/model.py``), the one worker thread that runs all torch work on them (``engines/worker.py``), the
per-row rules (``rows.py``), the policy version served, the status, and weight loads between decode steps. A
subclass is one batching path and holds its own parts: ``continuous.py`` (``ContinuousHFGenerator``) and
``static.py`` (``StaticHFGenerator``); ``build.py`` (``hf_generator``) picks one from the settings, once."""

from __future__ import annotations

import abc
import asyncio
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from agentjet.engines.base import GenerationError, GenerationResult, Generator, SamplingParams, TokenCallback
from agentjet.engines.model import PolicyModel
from agentjet.engines.worker import EngineWorker
from agentjet.generators.hf.rows import RowRules
from agentjet.settings import GeneratorSettings
from agentjet.weights.io import copy_weights_into

T = TypeVar("T")


def adapters_need_continuous(adapters: Sequence[str], why: str) -> ValueError:
    """The refusal of named LoRA adapters on a generator without continuous batching (``why``: what stands in
    the way), naming the setting to change."""
    return ValueError(f"named LoRA adapters {list(adapters)} need continuous batching, but {why}: set "
                      "generator.batching to 'continuous' (--batching continuous) with a model whose layers are all "
                      "full attention")


def served_context(settings: GeneratorSettings, context_length: int) -> int:
    """The context the generator serves: the model's, capped by ``generator.max_context``."""
    return min(settings.max_context or context_length, context_length)


def no_named_adapters(adapter: str) -> GenerationError:
    """The refusal of a request for a LoRA adapter on a generator that serves one policy."""
    return GenerationError(f"no LoRA adapter {adapter!r} on this engine: it serves one policy, not named adapters",
                           param="model")


def int_counters(stats: dict[str, Any]) -> dict[str, int]:
    """A generator's counters as integers (the status and Prometheus), from its stats."""
    return {k: int(v) for k, v in stats.items() if isinstance(v, int | float)}


class HFGenerator(Generator):
    """The embedded generator: transformers + torch on CPU or one CUDA device. Subclasses: one batching path each
    (``batching`` names it), submitting a checked request (``_submit``) and counting their work (``stats``)."""

    batching: ClassVar[str]  # "continuous" or "static", for the status

    def __init__(self, policy: PolicyModel, settings: GeneratorSettings | None = None) -> None:
        self.settings = settings = settings or GeneratorSettings()
        self.policy = policy
        self.model_path = policy.path
        self.device = policy.device
        self.dtype = policy.dtype
        self.model = policy.model
        self.causal_lm = policy.causal_lm
        self._tokenizer = policy.tokenizer
        self._max_context = served_context(settings, policy.facts.context_length)
        self.rules = RowRules(self._tokenizer, self._max_context, set(policy.facts.stop_ids), settings.seed)
        self.worker = EngineWorker()
        self.policy_version = 0

    # ----------------------------------------------------------------- properties
    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def capacity(self) -> int:
        return self.settings.max_batch_size

    @property
    @abc.abstractmethod
    def stats(self) -> dict[str, Any]:
        """The batching path's counters since start."""

    def counters(self) -> dict[str, int]:
        return int_counters(self.stats)

    def describe(self) -> dict[str, Any]:
        lora = self.policy.lora
        return {
            "kind": "hf", "model": str(self.model_path), "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "lora": {"rank": lora.rank, "alpha": lora.alpha, "targets": list(lora.targets)} if lora is not None
            else None,
            "gradient_checkpointing": self.policy.gradient_checkpointing,
            "max_batch_size": self.settings.max_batch_size, "max_context": self._max_context,
            "batching": self.batching,
            # the process's, which the engine thread shares with the HTTP event loop (generator.gil_switch_interval_ms)
            "gil_switch_interval_ms": round(sys.getswitchinterval() * 1000, 3)}

    # ----------------------------------------------------------------- generation
    def version_of(self, adapter: str | None) -> int:
        """The policy version that serves ``adapter``'s new tokens (None: the only policy). Raises
        ``GenerationError`` (``param="model"``) for an adapter this generator does not serve."""
        if adapter is None:
            return self.policy_version
        raise no_named_adapters(adapter)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None, adapter: str | None = None) -> GenerationResult:
        self.version_of(adapter)  # an adapter it does not serve fails here, at once
        self.rules.check_prompt(prompt_ids)
        return await self._submit(prompt_ids, sampling, on_token, adapter)

    @abc.abstractmethod
    async def _submit(self, prompt_ids: list[int], sampling: SamplingParams, on_token: TokenCallback | None,
                      adapter: str | None) -> GenerationResult:
        """Generate a request already checked (its adapter served, its prompt within the model's limits)."""

    # ----------------------------------------------------------------- the weights
    async def run_exclusive(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the engine's torch thread: between generation batches and decode steps, never
        during one (an in-process learner's step on these weights, a weight copy)."""
        return await self.worker.run(fn, *args)

    async def load_weights(self, path: Path, policy_version: int) -> None:
        """Copy a model directory's (or a safetensors file's) weights into the live parameters in place, between
        decode steps; new requests are generated at ``policy_version`` from then on."""
        def swap() -> None:
            copy_weights_into(self.model, path)
            self.policy_version = policy_version

        await self.worker.run(swap)

    async def close(self) -> None:
        await asyncio.to_thread(self.worker.close)
