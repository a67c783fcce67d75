"""What a call has generated so far, kept by the fleet: the server holds the tokens, so a call whose replica died or
hung goes on on another replica from them (its prompt plus the tokens kept, for the tokens still allowed), and the
reply is the tokens of every attempt in order.

Each kept token keeps its behaviour logprob (exact: the replica that sampled it computed it) and a policy version
that is never newer than the weights that sampled it: the version its replica held before the token arrived (at
the call's dispatch, or at the previous token), since a push lands on a replica before the fleet learns of it. The
attempt that finishes reports its own tokens' versions exactly. So a reply that moved carries honest per-token
versions, and the staleness mask treats its tokens one by one.

A stop string that ends in the kept tokens ends the call with them (the replica died after the stop, before its
answer); one that straddles the kept tokens and the continuation is not seen (the continuation checks its own
text only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from agentjet.engines.base import FinishReason, GenerationResult, SamplingParams


@dataclasses.dataclass
class Held:
    """The tokens of a call's earlier attempts (``kept``) and of the attempt running now (``streamed``)."""

    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    streamed: list[tuple[int, float, int]] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    def stream(self, token: int, logprob: float, version: int) -> None:
        """A token of the running attempt (``version``: the replica's before it arrived)."""
        self.streamed.append((token, logprob, version))

    def keep(self) -> int:
        """The running attempt failed: keep what it streamed (returns how many tokens are kept in all)."""
        for token, logprob, version in self.streamed:
            self.token_ids.append(token)
            self.logprobs.append(logprob)
            self.versions.append(version)
        self.streamed = []
        return len(self.token_ids)

    def restart(self) -> None:
        """A new attempt starts: nothing streamed yet."""
        self.streamed = []

    def next_call(self, prompt_ids: list[int], sampling: SamplingParams) -> tuple[list[int], SamplingParams]:
        """The prompt and sampling of the next attempt: it goes on after the kept tokens."""
        if not self.token_ids:
            return prompt_ids, sampling
        return [*prompt_ids, *self.token_ids], dataclasses.replace(sampling,
                                                                   max_tokens=sampling.max_tokens - len(self))

    def finished(self, sampling: SamplingParams, stop_ids: Collection[int], tokenizer: Any) -> FinishReason | None:
        """Whether the kept tokens already end the call (no tokens left, a stop id, a stop string), and how."""
        if not self.token_ids:
            return None
        if self.token_ids[-1] in stop_ids or self.token_ids[-1] in sampling.stop_token_ids:
            return FinishReason.STOP
        if sampling.stop and _stop_at(tokenizer.decode(self.token_ids, skip_special_tokens=True),
                                      sampling.stop) is not None:
            return FinishReason.STOP
        if len(self) >= sampling.max_tokens:
            return FinishReason.LENGTH
        return None

    def result(self, last: GenerationResult | None, sampling: SamplingParams, tokenizer: Any,
               finish: FinishReason | None = None) -> GenerationResult:
        """The reply: the kept tokens, then ``last`` (the attempt that finished; None when the kept tokens end the
        call, with ``finish``)."""
        if not self.token_ids and last is not None:
            return last
        ids = [*self.token_ids, *(last.token_ids if last else [])]
        versions = [*self.versions, *(last.versions if last else [])]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        cut = _stop_at(text, sampling.stop) if sampling.stop else None
        top = None
        if sampling.top_logprobs:  # a kept token's alternatives are gone with its replica: itself only
            top = [[(t, lp)] for t, lp in zip(self.token_ids, self.logprobs, strict=True)]
            top += (last.top_logprobs or [[] for _ in last.token_ids]) if last else []
        reason = last.finish_reason if last is not None else finish or FinishReason.LENGTH
        return GenerationResult(token_ids=ids, logprobs=[*self.logprobs, *(last.logprobs if last else [])],
                                finish_reason=reason, policy_version=min(versions), text=text[:cut],
                                top_logprobs=top, token_versions=versions)


def _stop_at(text: str, stops: tuple[str, ...]) -> int | None:
    hits = [i for s in stops if (i := text.find(s)) >= 0]
    return min(hits) if hits else None
