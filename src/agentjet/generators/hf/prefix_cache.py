"""The keys and values of finished rows, kept by token ids, so that a later prompt that starts the same way
prefills only what is new (``generator.prefix_cache_tokens``).

An agent harness (Claude Code, Codex) resends its whole history on every call, some 12k tokens; with the router's
affinity every call of an episode reaches the same replica, and keeping the previous call's keys and values makes
a call 1.7x cheaper at 2k tokens and 4.7x at 12k on the CPU (docs/benchmarks.md, "Rollout replicas").

What is kept: when a row finishes, its prompt and the tokens it generated (but the last, which no decode step fed
back), with their keys and values copied out of the slot KV cache. They are kept outside the slot pool, so a kept
prefix never holds a slot; the cache holds at most ``budget`` tokens, the least recently used going first. A row
shorter than ``KEEP_MIN_TOKENS`` is not kept (it is cheap to prefill again, and the copy would cost every short
request). An entry that a newer one extends (the same episode's previous call) is dropped when the newer is kept.

What is reused: a joining prompt's longest common prefix with a kept entry of the same adapter, at least
``MATCH_MIN_TOKENS`` long and one token short of the prompt at most (the last token's logits are needed). The key
of a token depends only on the tokens before it, so any common prefix is exact (up to the order of float sums: the
reused row's logprobs match a full prefill's to about 1e-5, not to the bit).

When it is stale: every job on the engine's thread may change the weights (a train step, a weight push, an adapter
added or removed), so a job (``EngineWorker.changes``) forgets every kept entry, and a row that a job overtook while
it was generating (its keys come from two sets of weights) is not kept. A job that only reads (a health ping) keeps
them (``EngineWorker.read``).

Everything here runs on the engine's one thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

KEEP_MIN_TOKENS = 256  # a finished row shorter than this is not kept
MATCH_MIN_TOKENS = 128  # a common prefix shorter than this is prefilled again, with the other joiners

LayerKV = tuple[torch.Tensor, torch.Tensor]  # one layer's keys and values of one row, [kv_heads, tokens, head_dim]


@dataclass(eq=False)  # an entry is itself: no two are equal by their tensors
class Kept:
    """One finished row's tokens (CPU, int64) and their keys and values, per layer."""

    ids: torch.Tensor
    adapter: str
    kv: list[LayerKV]
    used: int  # when it was last kept or reused (a tick of the cache)

    def common_prefix(self, prompt: torch.Tensor, limit: int) -> int:
        """How many of the first ``limit`` tokens of ``prompt`` this entry shares."""
        n = min(len(self.ids), limit)
        same = self.ids[:n] == prompt[:n]
        return n if bool(same.all()) else int((~same).nonzero()[0])


@dataclass(frozen=True)
class Match:
    entry: Kept
    tokens: int  # the prompt's first ``tokens`` have their keys and values in ``entry``


class PrefixCache:
    """Kept rows, at most ``budget`` tokens; ``changes()``: the engine thread's count of jobs that may have changed
    the weights (``EngineWorker.changes``)."""

    def __init__(self, budget: int, changes: Callable[[], int]) -> None:
        self.budget = budget
        self._changes = changes
        self._epoch = changes()
        self._entries: list[Kept] = []
        self._seated: dict[int, int] = {}  # slot -> the epoch its row was prefilled in
        self._tick = 0
        self.stats = {"prefix_lookups": 0, "prefix_hits": 0, "prefix_reused_tokens": 0, "prefix_kept": 0,
                      "prefix_evicted": 0, "prefix_forgotten": 0}

    @property
    def tokens(self) -> int:
        """Tokens kept now."""
        return sum(len(e.ids) for e in self._entries)

    @property
    def entries(self) -> int:
        return len(self._entries)

    def _current(self) -> int:
        """The epoch now; the entries are forgotten if a job ran since they were kept."""
        epoch = self._changes()
        if epoch != self._epoch:
            self.forget()
            self._epoch = epoch
        return epoch

    def forget(self) -> None:
        self.stats["prefix_forgotten"] += len(self._entries)
        self._entries = []

    def match(self, prompt: list[int], adapter: str) -> Match | None:
        """The kept entry that shares the longest prefix with ``prompt`` (same adapter), if it is long enough."""
        self._current()
        if len(prompt) <= MATCH_MIN_TOKENS or not self._entries:
            return None
        self.stats["prefix_lookups"] += 1
        ids = torch.tensor(prompt, dtype=torch.long)
        best: Match | None = None
        for entry in self._entries:
            if entry.adapter != adapter or (best is not None and len(entry.ids) <= best.tokens):
                continue
            n = entry.common_prefix(ids, len(prompt) - 1)
            if n >= MATCH_MIN_TOKENS and (best is None or n > best.tokens):
                best = Match(entry, n)
        if best is not None:
            self._tick += 1
            best.entry.used = self._tick
            self.stats["prefix_hits"] += 1
            self.stats["prefix_reused_tokens"] += best.tokens
        return best

    def seat(self, slot: int) -> None:
        """A row was prefilled into ``slot`` now."""
        self._seated[slot] = self._current()

    def wants(self, slot: int, tokens: int) -> bool:
        """Whether the row finishing in ``slot`` with ``tokens`` tokens is worth keeping (and still fresh)."""
        return (KEEP_MIN_TOKENS <= tokens <= self.budget
                and self._seated.get(slot) == self._current())

    def keep(self, ids: list[int], adapter: str, kv: list[LayerKV]) -> None:
        """Keep a finished row; the entries it extends go, then the least recently used until it fits."""
        tokens = torch.tensor(ids, dtype=torch.long)
        n = len(ids)
        self._entries = [e for e in self._entries
                         if not (e.adapter == adapter and len(e.ids) <= n and torch.equal(e.ids, tokens[: len(e.ids)]))]
        self._tick += 1
        self._entries.append(Kept(tokens, adapter, kv, self._tick))
        self.stats["prefix_kept"] += 1
        total = self.tokens
        while total > self.budget:
            oldest = min(self._entries, key=lambda e: e.used)
            self._entries.remove(oldest)
            total -= len(oldest.ids)
            self.stats["prefix_evicted"] += 1
