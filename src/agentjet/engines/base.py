"""The engine interface: owns the weights, generates tokens and runs policy-gradient updates."""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentjet.engines.errors import GenerationError

TokenCallback = Callable[[int, float], None]
MAX_SEED = 2**63  # seeds are in [0, 2**63): what a torch generator takes on every device


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
        checks = (
            ("temperature", 0 <= self.temperature < float("inf"), "must be >= 0"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", self.top_k >= 0, "must be >= 0"),
            ("max_tokens", self.max_tokens >= 1, "must be >= 1"),
            ("top_logprobs", 0 <= self.top_logprobs <= 20, "must be in [0, 20]"),
            ("seed", self.seed is None or 0 <= self.seed < MAX_SEED, f"must be in [0, {MAX_SEED})"),
        )
        for name, ok, rule in checks:
            if not ok:
                raise GenerationError(f"{name} {rule} (got {getattr(self, name)!r})", param=name)

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

    def set_loss(self, loss: Any) -> None:  # noqa: B027 - optional hook
        """Use these loss settings (``agentjet.settings.LossSettings``) from the next train step (live config)."""

    def describe(self) -> dict[str, Any]:
        """What runs where (device, dtype, LoRA...), for the status."""
        return {"kind": type(self).__name__}

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release background workers."""
