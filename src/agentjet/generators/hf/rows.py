"""One request's generation state and the per-token host work, shared by both of the embedded engine's
generation paths (the continuous scheduler and the static batch of ``generation.py``).

Each request is prepared on its own first (its seed, its stop set, its limits checked against the model), so a
request the model cannot serve fails alone, naming its parameter, before it joins any batch. The host work per
token is incremental: a stop id is a set lookup, a stop string is looked for in the decoded last few tokens only
(the whole text is decoded once, when one matches), and top-logprobs are copied for the rows that asked.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from agentjet.engines.base import FinishReason, GenerationError, GenerationResult, SamplingParams
from agentjet.generators.hf.batcher import Request

# A character is at most 4 UTF-8 bytes and a byte-level token holds at least one byte, so the last
# ``4 * len(stop) + 2`` tokens always hold a stop string that the newest token completed.
_STOP_WINDOW_BYTES = 4


@dataclass
class Row:
    """One request's state while it is generated."""

    req: Request
    generator: torch.Generator
    stop_ids: frozenset[int]
    budget: int
    stop_window: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: FinishReason | None = None
    cut_text: str | None = None  # the text cut before a stop string, when one matched
    slot: int = -1  # the continuous scheduler's slot (-1: none)
    policy_version: int = 0  # the weights' version when the request started (its first token's)
    versions: list[int] = field(default_factory=list)  # the weights' version that sampled each token

    @property
    def params(self) -> SamplingParams:
        return self.req.sampling

    @property
    def adapter(self) -> str | None:
        """The LoRA adapter that generates it (None: the generator's only policy)."""
        return self.req.adapter

    @property
    def length(self) -> int:
        """Prompt and generated tokens so far."""
        return len(self.req.prompt_ids) + len(self.ids)


class RowRules:
    """What the model allows (vocabulary, context, stop ids) and the per-token host work."""

    def __init__(self, tokenizer: Any, max_context: int, stop_ids: set[int], seed: int) -> None:
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.stop_ids = frozenset(stop_ids)
        self.vocab_size = len(tokenizer)
        self._rng = random.Random(seed)

    def check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise GenerationError("the prompt is empty", param="messages")
        if len(prompt_ids) >= self.max_context:
            raise GenerationError(f"the prompt has {len(prompt_ids)} tokens; the model's context is "
                                  f"{self.max_context} tokens", param="messages")
        if min(prompt_ids) < 0 or max(prompt_ids) >= self.vocab_size:
            raise GenerationError(f"prompt token ids must be in [0, {self.vocab_size})", param="messages")

    def prepare(self, req: Request, policy_version: int = 0) -> Row:
        """Everything about one request that can fail, done for it alone. The sampling generator lives on the
        CPU whatever the device: one uniform per token is drawn from it, so a seed gives the same draws on
        every device and in every batch."""
        p = req.sampling
        self.check_prompt(req.prompt_ids)
        if p.top_k > self.vocab_size:
            raise GenerationError(f"top_k must be at most the vocabulary size {self.vocab_size} (got {p.top_k})",
                                  param="top_k")
        if any(t < 0 or t >= self.vocab_size for t in p.stop_token_ids):
            raise GenerationError(f"stop token ids must be in [0, {self.vocab_size})", param="stop_token_ids")
        g = torch.Generator()
        g.manual_seed(p.seed if p.seed is not None else self._rng.getrandbits(63))
        window = max((len(s) for s in p.stop), default=0) * _STOP_WINDOW_BYTES + 2
        return Row(req, g, self.stop_ids | frozenset(p.stop_token_ids),
                   min(p.max_tokens, self.max_context - len(req.prompt_ids)), window,
                   policy_version=policy_version)

    def _stop_text(self, row: Row) -> str | None:
        """The whole text cut before the first stop string, if the newest token completed one."""
        tail = self.tokenizer.decode(row.ids[-row.stop_window:], skip_special_tokens=True)
        if not any(s in tail for s in row.params.stop):
            return None
        text = self.tokenizer.decode(row.ids, skip_special_tokens=True)
        hits = [text.find(s) for s in row.params.stop if s in text]
        return text[: min(hits)] if hits else None

    def accept(self, row: Row, token: int, logprob: float, top: list[tuple[int, float]] | None,
               emit: Callable[[Request, int, float], None] | None = None, version: int | None = None) -> None:
        """Record one generated token and the policy version that sampled it (``version``; the row's own when
        None), hand it to the caller's stream (``emit``, or the request's own), and decide whether the row is
        done."""
        row.ids.append(token)
        row.logprobs.append(logprob)
        row.versions.append(row.policy_version if version is None else version)
        if emit is not None:
            emit(row.req, token, logprob)
        else:
            row.req.emit(token, logprob)
        if top is not None:
            row.top.append(top)
        if token in row.stop_ids:
            row.finish = FinishReason.STOP
        elif row.params.stop and (cut := self._stop_text(row)) is not None:
            row.finish, row.cut_text = FinishReason.STOP, cut
        elif len(row.ids) >= row.budget:
            row.finish = FinishReason.LENGTH

    def result(self, row: Row) -> GenerationResult:
        text = row.cut_text if row.cut_text is not None else self.tokenizer.decode(row.ids, skip_special_tokens=True)
        return GenerationResult(token_ids=row.ids, logprobs=row.logprobs,
                                finish_reason=row.finish or FinishReason.LENGTH,
                                policy_version=row.versions[0] if row.versions else row.policy_version, text=text,
                                top_logprobs=row.top if row.params.top_logprobs else None,
                                token_versions=list(row.versions))


def top_lists(top: tuple[torch.Tensor, torch.Tensor] | None, rows: list[Row]) -> list[list[tuple[int, float]] | None]:
    """Each row's top-logprobs of this step as (token, logprob) pairs (None for rows that did not ask); one copy
    to the host for the whole batch."""
    if top is None or not any(r.params.top_logprobs for r in rows):
        return [None] * len(rows)
    values, ids = top[0].tolist(), top[1].tolist()
    return [list(zip(ids[i][: r.params.top_logprobs], values[i][: r.params.top_logprobs], strict=True))
            if r.params.top_logprobs else None for i, r in enumerate(rows)]
