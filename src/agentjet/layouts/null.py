"""A null engine: instant canned generations and no-op training. For measuring server overhead and for
protocol tests that do not care about the model."""

from __future__ import annotations

import asyncio
from collections import deque
from pathlib import Path
from typing import Any

from agentjet.engines.base import (
    Engine,
    FinishReason,
    GenerationResult,
    SamplingParams,
    StepOutput,
    TokenCallback,
    TrainSample,
)
from agentjet.weights.checkpoints import LEARNER_STATE, read_policy_version


class NullEngine(Engine):
    def __init__(self, tokenizer: Any, reply: str = "ok", delay_s: float = 0.0,
                 reply_ids: list[int] | None = None, update_at_token: int | None = None) -> None:
        """``reply_ids``: the exact ids to generate instead of ``reply``'s encoding (e.g. a non-canonical
        tokenization, to exercise drift handling); the end-of-sequence id is appended either way.
        ``update_at_token``: a reply's tokens from this index on are generated at the next policy version, as
        if a train step had landed between two decode steps (the engine's version moves with it): how tests
        exercise replies that span an update."""
        self._tokenizer = tokenizer
        ids = list(reply_ids) if reply_ids is not None else list(tokenizer.encode(reply, add_special_tokens=False))
        self._reply_ids = ids + [tokenizer.eos_token_id]
        self.delay_s = delay_s
        self.update_at_token = update_at_token
        self.policy_version = 0
        self.trained: deque[list[TrainSample]] = deque(maxlen=64)  # the latest batches (tests inspect them)
        self.prompts: deque[list[int]] = deque(maxlen=64)  # the latest prompts received

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None) -> GenerationResult:
        self.prompts.append(list(prompt_ids))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        ids = self._reply_ids[: sampling.max_tokens]
        versions = []
        for i, t in enumerate(ids):
            if i and i == self.update_at_token:
                self.policy_version += 1
            versions.append(self.policy_version)
            if on_token is not None:
                on_token(t, -0.1)
        finish = FinishReason.STOP if len(ids) == len(self._reply_ids) else FinishReason.LENGTH
        return GenerationResult(ids, [-0.1] * len(ids), finish, versions[0] if versions else self.policy_version,
                                text=self._tokenizer.decode(ids, skip_special_tokens=True), token_versions=versions)

    async def train_step(self, batch: list[TrainSample]) -> StepOutput:
        self.trained.append(batch)
        self.policy_version += 1
        # no trainer logprobs: nothing was computed (the trace viewer shows none)
        return StepOutput({"loss": 0.0, "samples": float(len(batch)), "policy_version": float(self.policy_version)})

    def save(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / LEARNER_STATE).write_text(f'{{"policy_version": {self.policy_version}}}')

    def load(self, path: Path) -> None:
        self.policy_version = read_policy_version(Path(path))
