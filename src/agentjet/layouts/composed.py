"""The engine the server drives: one generator composed with one learner, joined by one weight-sync seam
(``weights/sync.py``), typed on the pair it serves (``ComposedEngine[L, G]`` with a ``WeightSync[L, G]``). It is what
the server drives. It builds nothing itself: ``agentjet.layouts`` chooses and builds the parts.

A train step is the learner's step, then the seam's push. The step is committed once the learner returns (its
version moved), and it is reported as such whatever the push does, so its episodes count as trained exactly
once. A push that fails is retried before the next step while the generator serves the previous version; a push
that finds the generator's weights wrong (vLLM's probe, a timed-out swap) halts it: ``halted_reason`` is set, the
server pauses training, and the next step raises ``TrainingHaltedError`` rather than train on data from weights
nobody can check.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Generic, TypeVar

from agentjet.engines.base import (
    GenerationResult,
    Generator,
    Learner,
    SamplingParams,
    StepOutput,
    TokenCallback,
    TrainSample,
    WeightSyncCounts,
)
from agentjet.engines.errors import TrainingHaltedError
from agentjet.runtime.blocking import run_blocking
from agentjet.weights.sync import WeightSync

log = logging.getLogger(__name__)

L = TypeVar("L", bound=Learner)
G = TypeVar("G", bound=Generator)


class ComposedEngine(Generic[L, G]):
    """One model that generates and trains. Concurrent ``generate`` calls may be batched; ``train_step`` bumps the
    policy version and pushes the new weights to the generator."""

    def __init__(self, generator: G, learner: L, seam: WeightSync[L, G]) -> None:
        self.generator = generator
        self.learner = learner
        self.seam = seam
        self.sync_stats: dict[str, float] = {"weight_syncs": 0, "weight_sync_failures": 0}
        self._pushing = False

    @property
    def tokenizer(self) -> Any:
        return self.generator.tokenizer

    @property
    def max_context(self) -> int:
        return self.generator.max_context

    @property
    def halted_reason(self) -> str | None:
        """Why training must stop (the generator cannot be brought to the learner's weights), else None; the
        server pauses and reports it."""
        return self.generator.halted_reason

    @property
    def policy_version(self) -> int:
        """The learner's version (what the next checkpoint holds); each rollout records the version of the
        generator that produced it, so staleness counts from the weights being trained."""
        return self.learner.policy_version

    @property
    def generator_version(self) -> int:
        """The version whose weights the generator serves (behind the learner's while a push runs or after one
        failed)."""
        return self.generator.policy_version

    @property
    def weight_push_in_flight(self) -> bool:
        return self._pushing

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None, adapter: str | None = None,
                       session: str | None = None) -> GenerationResult:
        """Generate a completion. ``on_token(token_id, logprob)`` is called on the event loop for each token as
        it is produced (a generator without streaming calls it for all tokens at the end). ``adapter``: the
        LoRA adapter that generates it (``Generator.generate``); None, the generator's only policy. ``session``:
        the episode it belongs to, which a fleet of replicas routes by (``Generator.generate_for``)."""
        return await self.generator.generate_for(session, prompt_ids, sampling, on_token, adapter)

    async def train_step(self, batch: list[TrainSample]) -> StepOutput:
        if not batch:
            raise ValueError("train_step needs at least one sample")
        if self.halted_reason is not None:
            raise TrainingHaltedError(self.halted_reason)
        if self.generator.policy_version != self.learner.policy_version:
            await self.sync_weights()  # a push failed after the previous step: again, before training on
        out = await self.learner.train_step(batch)
        metrics = dict(out.metrics)
        try:
            metrics.update(await self.sync_weights())
        except TrainingHaltedError:  # the step is committed all the same: report it; ``halted_reason`` stops the next
            metrics["weight_sync_halted"] = 1.0
        except Exception:  # the step is committed: report it, serve the previous weights, push again next step
            self.sync_stats["weight_sync_failures"] += 1
            log.exception("pushing v%d to the generator failed; it serves v%d until the next step",
                          self.learner.policy_version, self.generator.policy_version)
        metrics["policy_version"] = float(self.learner.policy_version)
        metrics["rollout_policy_version"] = float(self.generator.policy_version)
        return StepOutput(metrics, out.trainer_logprobs)

    @property
    def weight_sync(self) -> WeightSyncCounts | None:
        """The seam's push counts, for the status; None for a seam that moves no weights (the null pair's)."""
        if self.seam.transport == "none":
            return None
        return WeightSyncCounts(syncs=int(self.sync_stats["weight_syncs"]),
                                failures=int(self.sync_stats["weight_sync_failures"]))

    async def sync_weights(self) -> dict[str, float]:
        self._pushing = True
        try:
            metrics = await self.seam.push(self.learner, self.generator)
        finally:
            self._pushing = False
        self.sync_stats["weight_syncs"] += 1
        return metrics

    def save(self, path: Path) -> None:
        self.learner.save(Path(path))

    def load(self, path: Path) -> None:
        """The learner loads the checkpoint; the generator then gets its weights through the seam."""
        self.learner.load(Path(path))
        run_blocking(self.sync_weights())  # blocks: from a thread (asyncio.to_thread), not the loop

    @property
    def learning_rate(self) -> float:
        return self.learner.learning_rate

    def set_learning_rate(self, lr: float) -> None:
        self.learner.set_learning_rate(lr)

    def set_loss(self, loss: Any) -> None:
        self.learner.set_loss(loss)

    def describe(self) -> dict[str, Any]:
        """What runs where (device, dtype, LoRA...), for the status."""
        return {**self.generator.describe(), **self.learner.describe(), "weight_sync": self.seam.transport,
                "layout": self.layout}

    @property
    def layout(self) -> str:
        """``<generator>+<learner>`` (the status and results files record it): hf+in-process, hf+trainer-group,
        hf-process+in-process, hf-process+trainer-group (the embedded generator in its engine process),
        vllm+in-process, vllm+trainer-group."""
        return f"{self.generator.describe().get('kind', 'generator')}+{self.learner.describe().get('learner')}"

    async def close(self) -> None:
        """Stop threads and processes (from synchronous code: ``run_blocking(engine.close())``)."""
        await self.seam.close()
        await self.learner.close()
        await self.generator.close()


E = TypeVar("E", bound=ComposedEngine[Any, Any])


class NamedEngines(Generic[E]):
    """The lookup every adapter layout shares (embedded: ``layouts/adapters.py``, vLLM:
    ``layouts/vllm_adapters.py``, null: ``layouts/null.py``): one engine per adapter name, in the order the adapters
    were added."""

    _engines: dict[str, E]

    def names(self) -> list[str]:
        """The adapters served now, in the order they were added."""
        return list(self._engines)

    def engine(self, name: str) -> E:
        """Adapter ``name``'s engine (generate, train_step, save, load, exports); a ValueError naming the adapters
        when there is none of that name."""
        engine = self._engines.get(name)
        if engine is None:
            raise ValueError(f"no LoRA adapter {name!r}: the adapters are {self.names()}")
        return engine
