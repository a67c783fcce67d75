"""The engine interface: owns the weights, generates tokens and runs policy-gradient updates."""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TokenCallback = Callable[[int, float], None]


class FinishReason(enum.StrEnum):
    STOP = "stop"  # an end-of-turn / stop token or a stop string
    LENGTH = "length"  # max_tokens or the context window was reached


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 disables
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0  # how many alternatives to return per generated token

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError("top_logprobs must be in [0, 20]")

    @property
    def logprob_temperature(self) -> float:
        """The temperature whose distribution the behaviour logprobs are taken from (1.0 when greedy)."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclass(frozen=True)
class GenerationResult:
    token_ids: list[int]
    logprobs: list[float]  # log p(token) under softmax(logits / temperature), untruncated by top-p/top-k
    finish_reason: FinishReason
    policy_version: int
    # Text produced, already cut before a matched stop string (the tokens are not cut: they were generated).
    text: str = ""
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass
class TrainSample:
    """One training sequence. Algorithm-blind: advantages and weights come precomputed per token.

    ``loss_mask[t]``, ``behaviour_logprobs[t]`` and ``advantages[t]`` refer to token ``input_ids[t]``
    (the token being predicted from the prefix ``input_ids[:t]``); position 0 is never trained.
    """

    input_ids: list[int]
    loss_mask: list[int]
    behaviour_logprobs: list[float]
    advantages: list[float]
    temperature: float = 1.0
    weight: float = 1.0  # multiplies every token's loss (per-episode normalisation uses 1/k)
    # Output, filled by engines that can: the logprob the update used for each trained token, in order (the trace
    # viewer shows it next to the behaviour logprob).
    trainer_logprobs: list[float] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        for name in ("loss_mask", "behaviour_logprobs", "advantages"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"TrainSample.{name} has length {len(getattr(self, name))}, expected {n}")
        if n and self.loss_mask[0]:
            raise ValueError("TrainSample.loss_mask[0] must be 0: the first token has no prefix to predict it")

    @property
    def num_trained_tokens(self) -> int:
        return int(sum(self.loss_mask))


@dataclass
class TrainConfig:
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    max_grad_norm: float = 1.0
    kl_coef: float = 0.0  # > 0 keeps a frozen reference model (k3 estimator)
    micro_batch_tokens: int = 4096  # padded tokens per forward/backward micro-batch
    logprob_chunk_tokens: int = 1024  # rows of the vocabulary projection computed at once
    bf16: bool = False  # autocast the forward pass to bfloat16
    extra: dict[str, Any] = field(default_factory=dict)


class Engine(abc.ABC):
    """Owns a model. Concurrent ``generate`` calls may be batched; ``train_step`` bumps the policy version."""

    policy_version: int = 0

    @property
    @abc.abstractmethod
    def tokenizer(self) -> Any: ...

    @property
    def max_context(self) -> int:
        return 4096

    @abc.abstractmethod
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None) -> GenerationResult:
        """Generate a completion. ``on_token(token_id, logprob)`` is called on the event loop for each
        token as it is produced (engines without streaming call it for all tokens at the end)."""

    @abc.abstractmethod
    async def train_step(self, batch: list[TrainSample]) -> dict[str, float]: ...

    @abc.abstractmethod
    def save(self, path: Path) -> None: ...

    @abc.abstractmethod
    def load(self, path: Path) -> None: ...

    def set_learning_rate(self, lr: float) -> None:  # noqa: B027 - optional hook
        """Change the optimizer's learning rate in place (live config)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release background workers."""
