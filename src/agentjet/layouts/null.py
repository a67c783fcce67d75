"""The null pair: a generator of instant canned replies and a learner whose training is a no-op, joined by a seam
that moves no weights. For measuring server overhead and for protocol tests that do not care about the model.

``null_engine(tokenizer, ...)`` composes them; ``compose_null`` composes given (e.g. a test's subclassed) parts.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentjet.engines.base import (
    FinishReason,
    GenerationResult,
    Generator,
    Learner,
    SamplingParams,
    StepOutput,
    TokenCallback,
    TrainSample,
)
from agentjet.layouts.composed import ComposedEngine, NamedEngines
from agentjet.weights.checkpoints import LEARNER_STATE, read_policy_version
from agentjet.weights.sync import WeightSync


class NullGenerator(Generator):
    def __init__(self, tokenizer: Any, reply: str = "ok", delay_s: float = 0.0,
                 reply_ids: list[int] | None = None, update_at_token: int | None = None,
                 on_update: Callable[[int], None] | None = None) -> None:
        """``reply_ids``: the exact ids to generate instead of ``reply``'s encoding (e.g. a non-canonical
        tokenization, to exercise drift handling); the end-of-sequence id is appended either way.
        ``update_at_token``: a reply's tokens from this index on are generated at the next policy version, as
        if a train step had landed between two decode steps: how tests exercise replies that span an update.
        ``on_update(version)`` is called when that happens, so the learner's version moves with it
        (``compose_null`` wires it)."""
        self._tokenizer = tokenizer
        ids = list(reply_ids) if reply_ids is not None else list(tokenizer.encode(reply, add_special_tokens=False))
        self.reply_ids = ids + [tokenizer.eos_token_id]
        self.delay_s = delay_s
        self.update_at_token = update_at_token
        self.on_update = on_update
        self.policy_version = 0
        self.prompts: deque[list[int]] = deque(maxlen=64)  # the latest prompts received (tests inspect them)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def describe(self) -> dict[str, Any]:
        return {"kind": "null"}

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None, adapter: str | None = None) -> GenerationResult:
        """The canned reply, whatever the prompt and the adapter (it has no weights to tell adapters apart)."""
        self.prompts.append(list(prompt_ids))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        ids = self.reply_ids[: sampling.max_tokens]
        versions = []
        for i, t in enumerate(ids):
            if i and i == self.update_at_token:
                self.policy_version += 1
                if self.on_update is not None:
                    self.on_update(self.policy_version)
            versions.append(self.policy_version)
            if on_token is not None:
                on_token(t, -0.1)
        finish = FinishReason.STOP if len(ids) == len(self.reply_ids) else FinishReason.LENGTH
        return GenerationResult(ids, [-0.1] * len(ids), finish, versions[0] if versions else self.policy_version,
                                text=self._tokenizer.decode(ids, skip_special_tokens=True), token_versions=versions)


class NullLearner(Learner):
    """Training is a no-op that moves the version; the latest batches are kept (tests inspect them)."""

    def __init__(self, learning_rate: float = 0.0) -> None:
        self.policy_version = 0
        self.trained: deque[list[TrainSample]] = deque(maxlen=64)
        self._learning_rate = learning_rate

    def describe(self) -> dict[str, Any]:
        return {"learner": "null"}

    async def train_step(self, batch: list[TrainSample]) -> StepOutput:
        self.trained.append(batch)
        self.policy_version += 1
        # no trainer logprobs: nothing was computed (the trace viewer shows none)
        return StepOutput({"loss": 0.0, "samples": float(len(batch)), "policy_version": float(self.policy_version)})

    async def score(self, samples: list[TrainSample]) -> list[list[float]]:
        return [[-0.1] * s.num_trained_tokens for s in samples]

    async def export_weights(self, dtype: str | None = None) -> Path:
        raise NotImplementedError("the null learner has no weights to export")

    def save(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / LEARNER_STATE).write_text(f'{{"policy_version": {self.policy_version}}}')

    def load(self, path: Path) -> None:
        self.policy_version = read_policy_version(Path(path))

    @property
    def learning_rate(self) -> float:
        return self._learning_rate

    def set_learning_rate(self, lr: float) -> None:
        self._learning_rate = lr

    def set_loss(self, loss: Any) -> None:
        pass


class NullSync(WeightSync[NullLearner, NullGenerator]):
    """No weights move: the generator only takes the learner's version (after a step, after a load). A seam
    without a transport has no push counts (the status shows null)."""

    transport = "none"

    async def _push(self, learner: NullLearner, generator: NullGenerator) -> dict[str, float]:
        generator.policy_version = learner.policy_version
        return {}


def compose_null(generator: NullGenerator, learner: NullLearner) -> ComposedEngine[NullLearner, NullGenerator]:
    """The pair as one engine; a reply that spans an update (``update_at_token``) moves the learner's version
    with the generator's, as a step landing between two decode steps would."""

    def follow(version: int) -> None:
        learner.policy_version = version

    generator.on_update = follow
    return ComposedEngine(generator, learner, NullSync())


def null_engine(tokenizer: Any, reply: str = "ok", delay_s: float = 0.0, reply_ids: list[int] | None = None,
                update_at_token: int | None = None) -> ComposedEngine[NullLearner, NullGenerator]:
    """Instant canned generations (``NullGenerator``'s options) and no-op training."""
    return compose_null(NullGenerator(tokenizer, reply, delay_s, reply_ids, update_at_token), NullLearner())


class NullAdapters(NamedEngines[ComposedEngine[NullLearner, NullGenerator]]):
    """Several null engines under adapter names: the server's adapter lanes without a model (protocol tests and
    benchmarks of the routing and the per-adapter training cores). Each adapter is its own null pair."""

    def __init__(self, tokenizer: Any, names: list[str], reply: str = "ok", delay_s: float = 0.0) -> None:
        self._tokenizer = tokenizer
        self._reply = reply
        self._delay_s = delay_s
        self._engines: dict[str, ComposedEngine[NullLearner, NullGenerator]] = {}
        for name in names:
            self._engines[name] = null_engine(tokenizer, reply, delay_s)

    async def add(self, name: str, rank: int | None = None,
                  unembed: bool = False) -> ComposedEngine[NullLearner, NullGenerator]:
        if name in self._engines:
            raise ValueError(f"adapter {name!r} exists already")
        self._engines[name] = engine = null_engine(self._tokenizer, self._reply, self._delay_s)
        return engine

    async def remove(self, name: str) -> None:
        engine = self.engine(name)
        del self._engines[name]
        await engine.close()

    async def close(self) -> None:
        for engine in self._engines.values():
            await engine.close()
