"""The role interfaces: a ``Generator`` generates tokens, a ``Learner`` runs policy-gradient updates, and the data
types between them and the server. ``agentjet.layouts`` composes one of each into the engine the server drives: an
``Engine`` (one policy), or an ``AdapterSet`` (several LoRA adapters on one base, one ``Engine`` each)."""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agentjet.engines.errors import GenerationError
from agentjet.protocol import FleetStatus

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
    # The policy version that generated each token (None: all at ``policy_version``). A reply that spans a
    # weight update carries two or more versions; ``policy_version`` is always the oldest (its first token's).
    token_versions: list[int] | None = None

    @property
    def versions(self) -> list[int]:
        """One policy version per generated token."""
        if self.token_versions is None:
            return [self.policy_version] * len(self.token_ids)
        return list(self.token_versions)


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


@dataclass(frozen=True)
class StepOutput(Mapping[str, float]):
    """What a train step gives back; the batch it was given is not changed. It reads as its metrics
    (``out["loss"]``, ``{**out}``).

    ``trainer_logprobs[i]`` holds, for sample ``i`` of the batch (in the batch's order), the logprob the update
    used for each of its trained tokens, in order (the trace viewer shows it next to the behaviour logprob)."""

    metrics: dict[str, float]
    trainer_logprobs: list[list[float]] = field(default_factory=list)

    def __getitem__(self, key: str) -> float:
        return self.metrics[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.metrics)

    def __len__(self) -> int:
        return len(self.metrics)


class Generator(abc.ABC):
    """The rollout role: generates (or streams) tokens with their behaviour logprobs, says which policy version
    it serves and how many requests it runs at once, and accepts new weights through a weight-sync seam
    (``agentjet.weights.sync``). Implementations: the embedded engine (``generators/hf``), vLLM (``generators/vllm``)
    and the null generator (``layouts/null.py``)."""

    policy_version: int = 0  # the version whose weights serve new requests
    halted_reason: str | None = None  # set when it cannot be brought to the learner's weights (training stops)

    @property
    @abc.abstractmethod
    def tokenizer(self) -> Any: ...

    @property
    def max_context(self) -> int:
        return 4096

    @property
    def capacity(self) -> int:
        """Requests generated concurrently (more wait in a queue)."""
        return 1

    def counters(self) -> dict[str, int]:
        """Batching counters since start (prefills, decode steps and their rows, CUDA-graph replays...), for the
        status and Prometheus; empty for a generator that keeps none."""
        return {}

    @abc.abstractmethod
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None, adapter: str | None = None) -> GenerationResult:
        """Generate a completion. ``on_token(token_id, logprob)`` is called on the event loop for each token as
        it is produced (a generator without streaming calls it for all tokens at the end).

        ``adapter``: the LoRA adapter that generates this request, by name, on a generator that serves several
        adapters on one base (``layouts/adapters.py``); None is the generator's only policy. A generator that
        does not serve that adapter raises ``GenerationError`` with ``param="model"``."""

    async def generate_for(self, session: str | None, prompt_ids: list[int], sampling: SamplingParams,
                           on_token: TokenCallback | None = None, adapter: str | None = None) -> GenerationResult:
        """``generate`` on behalf of ``session`` (an episode, a Tinker sampling client; None: no session): a fleet of
        replicas (``generators/fleet``) sends a session's calls to one replica, where its prefix is cached; one
        generator has nothing to route and generates."""
        if adapter is None:  # the three-argument call: a generator written before adapters still serves it
            return await self.generate(prompt_ids, sampling, on_token)
        return await self.generate(prompt_ids, sampling, on_token, adapter=adapter)

    def fleet(self) -> FleetStatus | None:
        """Its replicas and the router's counts, for the status; None for a generator that is not a fleet."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": type(self).__name__}

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release background workers and processes (from synchronous code: ``runtime.blocking.run_blocking``)."""


class Learner(abc.ABC):
    """The training role: ``train_step(batch) -> StepOutput`` (bumps ``policy_version``), one optimizer config
    (live: ``set_learning_rate``), scoring for probes, its own save/load, and an export of its weights for a
    generator. Implementations: in process (``agentjet.learners.inprocess``), an FSDP2 trainer group
    (``agentjet.distributed.learner``), both running ``learners.policy_step.run_policy_step``, and the null learner
    (``layouts/null.py``)."""

    policy_version: int = 0  # the version of the weights it holds (what the next export holds)

    @abc.abstractmethod
    async def train_step(self, batch: list[TrainSample]) -> StepOutput: ...

    @abc.abstractmethod
    async def score(self, samples: list[TrainSample]) -> list[list[float]]:
        """Current-policy logprobs of each sample's trained tokens (teacher forcing, no update)."""

    @abc.abstractmethod
    async def export_weights(self, dtype: str | None = None) -> Path:
        """A complete Hugging Face model directory of the current version's weights (untied, by the one rule in
        ``weights/io.py``), in a directory of its own per version under the learner's export root; the
        learner keeps the newest few. ``dtype`` casts floating tensors (a learner may ignore it)."""

    async def export_adapter(self) -> Path:
        """The current version's LoRA adapter (PEFT files) in a directory of its own, for a generator that
        loads adapters by name. Only a learner that trains LoRA adapters has one."""
        raise NotImplementedError(f"{type(self).__name__} trains the full weights: it has no LoRA adapter to export")

    @abc.abstractmethod
    def save(self, path: Path) -> None:
        """Weights, optimizer and policy version, so that ``load`` resumes exactly."""

    @abc.abstractmethod
    def load(self, path: Path) -> None: ...

    @property
    @abc.abstractmethod
    def learning_rate(self) -> float: ...

    @abc.abstractmethod
    def set_learning_rate(self, lr: float) -> None:
        """Takes effect at the next step."""

    @abc.abstractmethod
    def set_loss(self, loss: Any) -> None:
        """``agentjet.settings.LossSettings`` from the next step (a KL term switched on may need a restart)."""

    def describe(self) -> dict[str, Any]:
        return {"learner": type(self).__name__}

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release threads and processes (from synchronous code: ``runtime.blocking.run_blocking``)."""


@dataclass(frozen=True)
class WeightSyncCounts:
    """Weight pushes from the learner to the generator since start (the seam's), for the status."""

    syncs: int  # pushes that brought the generator to the learner's version
    failures: int  # pushes that failed after a committed step (the generator served the previous version)


class Engine(Protocol):
    """The pair the server drives: one generator and one learner joined by a weight-sync seam (its implementation:
    ``layouts/composed.py: ComposedEngine``, built by ``agentjet.layouts``). The server reaches an engine through
    these members only, and its two roles through their interfaces (``Generator``, ``Learner``)."""

    @property
    def generator(self) -> Generator: ...

    @property
    def learner(self) -> Learner: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def max_context(self) -> int: ...

    @property
    def policy_version(self) -> int:
        """The learner's version (what the next checkpoint holds)."""
        ...

    @property
    def generator_version(self) -> int:
        """The version whose weights the generator serves (behind the learner's while a push runs)."""
        ...

    @property
    def weight_push_in_flight(self) -> bool: ...

    @property
    def weight_sync(self) -> WeightSyncCounts | None:
        """The seam's push counts, for the status; None for a seam that moves no weights."""
        ...

    @property
    def halted_reason(self) -> str | None:
        """Why training must stop (the generator cannot be brought to the learner's weights), else None."""
        ...

    @property
    def layout(self) -> str:
        """``<generator>+<learner>``, for the status and results files."""
        ...

    @property
    def learning_rate(self) -> float: ...

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None, adapter: str | None = None,
                       session: str | None = None) -> GenerationResult:
        """``session``: the episode (or Tinker sampling client) the call belongs to, which a fleet of replicas
        routes by (``Generator.generate_for``)."""
        ...

    async def train_step(self, batch: list[TrainSample]) -> StepOutput:
        """The learner's step, then the seam's push of the new weights to the generator."""
        ...

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None:
        """The learner loads the checkpoint; the generator then gets its weights (blocks: from a thread)."""
        ...

    def set_learning_rate(self, lr: float) -> None: ...

    def set_loss(self, loss: Any) -> None: ...

    def describe(self) -> dict[str, Any]:
        """What runs where (device, dtype, LoRA...), for the status."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class AdapterSet(Protocol):
    """Several LoRA adapters on one base, one ``Engine`` each, added and removed at run time: what the server
    reads of the adapter layouts (``layouts/adapters.py``, ``layouts/vllm_adapters.py``, ``layouts/null.py``)."""

    def names(self) -> list[str]: ...

    def engine(self, name: str) -> Engine: ...

    async def add(self, name: str, rank: int | None = None, unembed: bool = False) -> Engine:
        """A fresh adapter; ``unembed``: LoRA on the output layer too (the Tinker SDK's ``train_unembed``)."""
        ...

    async def remove(self, name: str) -> None: ...

    async def close(self) -> None: ...
