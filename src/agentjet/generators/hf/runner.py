"""The device half of continuous batching: prefill joining requests into their slots and run one decode step
over slots ``[0, n)``, on the slot KV cache of ``kv_cache.py``.

A decode step's inputs live in preallocated device tensors (the last token of every slot, every slot's start
column, the write column ``t``), and everything derived from them (position ids, the 4D attention mask) is
computed on the device. So for a given row count ``n`` and attention window ``w`` the step has static shapes
and needs nothing from the host but ``t``. Eagerly (CPU), ``w = t + 1``: attention reads only the columns in
use. With CUDA graphs (or ``torch.compile``), ``n`` and ``w`` are rounded up to buckets and each (n, w) is
captured once and replayed. A captured graph is checked against an eager step on its first replay; a graph that
cannot be captured or disagrees is dropped, with a warning, and that bucket runs eagerly.

An eager prefill is a forward of the whole model in thousands of op calls, which at small model sizes costs the
time of dispatching them, whatever the rows (docs/benchmarks.md, "GPU check"). With CUDA graphs a prefill is static
too: the joining rows are padded to a row bucket and their prompts (left-padded) to a window bucket, its inputs
copied into that bucket's device buffers, and the (rows, window) graph replayed; a block of more than
``STATIC_PREFILL_MAX_TOKENS`` padded tokens runs eagerly. Pad rows write their keys and values into a scratch slot
that no decode step reads (the cache has one row more than ``slots``). Checked and dropped per bucket like the decode
graphs.

Train steps update the weights in place (the optimizer writes into the same tensors), so the graphs read the new
weights with no recapture. Compaction moves cache columns in place; only growing the cache reallocates it, and
then every graph is captured again.

Kept prefixes (``prefix_cache.py``): a joining prompt that starts with a kept row's tokens has their keys and values
copied into its slot and runs only the rest of its prompt, alone and eagerly (``_extend``); a finished row's columns
are copied out (``keep``).

Named LoRA adapters (``mixed_adapters``): each slot remembers the adapter of the row in it, and every forward of
a prefill or a decode step names each row's adapter (a free slot is PEFT's ``__base__``), so rows of different
adapters run in one forward: through the per-row LoRA of ``lora_rows.py`` (the stacked adapters and a row mask:
about the cost of one adapter), or PEFT's own ``adapter_names`` for adapters it does not handle (DoRA, LoRA on
embeddings). Either way the adapters are chosen on the host at every forward, which a CUDA graph or
``torch.compile`` cannot capture: such a runner always runs eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from agentjet.generators.hf.graphs import GraphCache
from agentjet.generators.hf.kv_cache import INACTIVE_START, SlotKVCache
from agentjet.generators.hf.lora_rows import RowAdapters
from agentjet.generators.hf.prefix_cache import Match, PrefixCache
from agentjet.settings.learner import BASE_ADAPTER

log = logging.getLogger(__name__)


def batch_buckets(slots: int) -> list[int]:
    """Row counts a decode step is padded to: powers of two below ``slots``, and ``slots``."""
    sizes, n = [], 1
    while n < slots:
        sizes.append(n)
        n *= 2
    return [*sizes, slots]


WINDOW_MIN = 64  # the smallest attention window bucket (graphs, compile)
# the largest static prefill, rows x window: a graph keeps its activations in the graph pool, so a bigger block runs
# eagerly (a prefill of many long prompts is bound by compute, not by dispatching ops, anyway)
STATIC_PREFILL_MAX_TOKENS = 16_384
COMPACT_MIN = 32  # compact when at least this many unused columns lead the window and they are half of it


def window_bucket(needed: int, capacity: int) -> int:
    w = WINDOW_MIN
    while w < needed:
        w *= 2
    return min(w, capacity)


def block_mask(lengths: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ids ``[k, width]`` and the 4D attention mask ``[k, 1, width, width]`` of a block of left-padded
    prompts of ``lengths``, on ``lengths``' device: causal within each prompt; a pad query, which would attend to
    nothing, sees itself (its output is never used)."""
    cols = torch.arange(width, device=lengths.device)
    valid = cols[None, :] >= (width - lengths)[:, None]
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    causal = torch.ones((width, width), dtype=torch.bool, device=lengths.device).tril()
    eye = torch.eye(width, dtype=torch.bool, device=lengths.device)
    return positions, ((causal[None] & valid[:, None, :]) | eye[None])[:, None]


@dataclass
class _PrefillInputs:
    """A prefill bucket's device inputs, copied in before each replay: left-padded ids ``[K, W]``, each row's prompt
    length ``[K]`` (0: a pad row), each row's slot ``[K]`` and the block's first column."""

    ids: torch.Tensor
    lengths: torch.Tensor
    slots: torch.Tensor
    first_column: torch.Tensor


class SlotRunner:
    """Owns the slot KV cache and the decode step's static inputs; optionally CUDA graphs and torch.compile.
    ``mixed_adapters``: the model is a PEFT model with named adapters and every forward names each row's (eager
    only: ``cuda_graphs`` and ``compile`` are then ignored). ``prefixes``: the kept prefixes (None: none kept)."""

    def __init__(self, model: torch.nn.Module, config: Any, device: torch.device, dtype: torch.dtype, slots: int,
                 capacity: int, max_capacity: int, pad_id: int, cuda_graphs: bool = False,
                 compile: bool = False, mixed_adapters: bool = False, static_prefill: bool | None = None,
                 prefixes: PrefixCache | None = None) -> None:
        """``static_prefill``: prefills padded to (rows, width) buckets from device buffers (default: with CUDA
        graphs, which then capture them; eagerly otherwise, as the CPU tests check the padding)."""
        self.model = model
        self.prefixes = prefixes
        self.adapters = RowAdapters(model, slots, mixed_adapters)  # each slot's adapter, and how rows mix them
        if mixed_adapters:
            cuda_graphs = compile = False
        self.config = config
        self.device = device
        self.slots = slots
        self.max_capacity = max_capacity
        self.pad_id = pad_id
        self.use_graphs = cuda_graphs and device.type == "cuda"
        self.static_prefill = self.use_graphs if static_prefill is None else static_prefill and not mixed_adapters
        self.scratch = slots  # the cache row that a static prefill's pad rows write into (no decode step reads it)
        self.cache = SlotKVCache(config, slots + 1, min(capacity, max_capacity), dtype, device)
        self._prefill_inputs: dict[tuple[int, int], _PrefillInputs] = {}
        self.tokens = torch.zeros((slots, 1), dtype=torch.long, device=device)  # each slot's next input token
        self.start = torch.full((slots,), INACTIVE_START, dtype=torch.long, device=device)
        self.starts = [INACTIVE_START] * slots  # the host's copy
        self.step_t = torch.zeros((), dtype=torch.long, device=device)  # the device copy of ``t``
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        self.t = 0  # the next column a decode step writes
        self.buckets = batch_buckets(slots)
        self.bucketed = self.use_graphs or compile  # static shapes: round n and the window up
        self._step_fn: Callable[[int, int], torch.Tensor] = self._decode_body
        if compile:
            # automatic dynamic shapes: the second (rows, window) shape compiles a dynamic kernel set, so a few
            # compilations cover every bucket (one row is a specialisation of its own)
            self._step_fn = torch.compile(self._decode_body, dynamic=None)
        self.stats = {"graph_captures": 0, "graph_replays": 0, "graph_failures": 0, "cache_grows": 0,
                      "compactions": 0, "static_prefills": 0}
        self.graphs = GraphCache(device, self.stats)  # ("decode" | "prefill", rows, window) -> its CUDA graph

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    def bucket(self, rows: int) -> int:
        return next(b for b in self.buckets if b >= rows) if self.bucketed else rows

    # ------------------------------------------------------------------ columns
    def ensure_capacity(self, needed: int) -> None:
        """Grow the cache (doubling, at most ``max_capacity``) so that a row of ``needed`` tokens fits."""
        if needed <= self.cache.capacity:
            return
        if needed > self.max_capacity:
            raise ValueError(f"a row of {needed} tokens exceeds the KV cache limit of {self.max_capacity}")
        new = self.cache.capacity
        while new < needed:
            new *= 2
        self.cache.grow(min(new, self.max_capacity), self.t)
        self.graphs.clear()  # they read the old tensors
        self.stats["cache_grows"] += 1
        log.info("KV cache grown to %d columns x %d slots (%.0f MiB)", self.cache.capacity, self.slots,
                 self.cache.bytes / 2**20)

    def _move(self, delta: int) -> None:
        """Every slot in use now starts ``delta`` columns later (the cache moved its columns)."""
        self.t += delta
        self.starts = [s + delta if s != INACTIVE_START else s for s in self.starts]
        self.start.copy_(torch.tensor(self.starts, dtype=torch.long), non_blocking=True)

    def _lowest_start(self) -> int | None:
        used = [s for s in self.starts if s != INACTIVE_START]
        return min(used) if used else None

    def _compact_if_due(self) -> None:
        lo = self._lowest_start()
        if lo is None or lo <= 0:
            return
        if self.t >= self.cache.capacity or (lo >= COMPACT_MIN and 2 * lo >= self.t):
            self.cache.compact(lo, self.t)
            self._move(-lo)
            self.stats["compactions"] += 1

    # ------------------------------------------------------------------ prefill
    @torch.inference_mode()
    def prefill(self, slots: list[int], prompts: list[list[int]],
                adapters: list[str | None] | None = None) -> torch.Tensor:
        """Run the prompts of joining rows, write their keys and values into their slots so that they end right
        before column ``t``, and return each one's next-token logits ``[k, V]``. A prompt that starts with a kept
        prefix runs its rest alone; the others are left-padded into one block. ``adapters``: each joining row's
        LoRA adapter (mixed_adapters; None: the base)."""
        names = [a or BASE_ADAPTER for a in adapters] if adapters is not None else [BASE_ADAPTER] * len(prompts)
        prefixes = self.prefixes
        hits = ([prefixes.match(p, a) for p, a in zip(prompts, names, strict=True)]
                if prefixes is not None else [None] * len(slots))
        if not any(hits):
            return self._prefill_block(slots, prompts, names)
        block = [i for i, hit in enumerate(hits) if hit is None]
        logits: dict[int, torch.Tensor] = {}
        if block:
            out = self._prefill_block([slots[i] for i in block], [prompts[i] for i in block], [names[i] for i in block])
            logits.update(zip(block, out, strict=True))
        for i, hit in enumerate(hits):
            if hit is not None:
                logits[i] = self._extend(slots[i], prompts[i], hit, names[i])[0]
        return torch.stack([logits[i] for i in range(len(slots))])

    def _prefill_block(self, slots: list[int], prompts: list[list[int]], names: list[str]) -> torch.Tensor:
        """The joiners' prompts, left-padded into one block (statically padded to a bucket when it can be)."""
        k, width = len(prompts), max(len(p) for p in prompts)
        if width >= self.cache.capacity:
            raise ValueError(f"a prompt of {width} tokens does not fit the {self.cache.capacity}-column KV cache")
        if self.static_prefill:
            rows, window = next(b for b in self.buckets if b >= k), window_bucket(width, self.cache.capacity)
            # else the eager block: it needs fewer columns, and a big block is not bound by dispatching ops
            if max(self.t, window) < self.cache.capacity and rows * window <= STATIC_PREFILL_MAX_TOKENS:
                return self._prefill_static(slots, prompts, rows, window)
        self._make_room(width)
        lengths = [len(p) for p in prompts]
        positions, mask = block_mask(torch.tensor(lengths, dtype=torch.long), width)
        dev = self.device
        # no padding: the mask is plain causal, and without one SDPA runs its causal kernel (an explicit [k, 1, W, W]
        # mask made a 12k-token call 1.7x plain transformers' on the CPU, docs/benchmarks.md)
        causal = min(lengths) == width
        self.cache.begin_prefill(torch.tensor(slots, dtype=torch.long, device=dev),
                                 torch.arange(self.t - width, self.t, device=dev))
        try:
            with self.adapters.rows(names) as extra:
                out = self.model(input_ids=self._left_padded(prompts, width, k).to(dev),
                                 attention_mask=None if causal else mask.to(dev), position_ids=positions.to(dev),
                                 past_key_values=self.cache, use_cache=True, logits_to_keep=1, **extra)
        finally:
            self.cache.end()
        self._seat(slots, lengths, names)
        return out.logits[:, -1, :]

    def _extend(self, slot: int, prompt: list[int], hit: Match, name: str) -> torch.Tensor:
        """A prompt whose first ``hit.tokens`` are kept: their keys and values into the slot, then the rest of the
        prompt attending to them and to itself; its next-token logits ``[1, V]``."""
        p, m = hit.tokens, len(prompt) - hit.tokens
        self._make_room(p + m)
        lo, dev = self.t - p - m, self.device
        self.cache.write_row(slot, lo, hit.entry.kv, p)
        mask = torch.ones((m, p + m), dtype=torch.bool, device=dev).tril(p)  # query i sees the prefix and [0, i]
        self.cache.begin_extend(slot, lo, self.t)
        try:
            with self.adapters.rows([name]) as extra:
                out = self.model(input_ids=torch.tensor([prompt[p:]], dtype=torch.long).to(dev),
                                 attention_mask=mask[None, None], position_ids=torch.arange(p, p + m, device=dev)[None],
                                 past_key_values=self.cache, use_cache=True, logits_to_keep=1, **extra)
        finally:
            self.cache.end()
        self._seat([slot], [p + m], [name])
        return out.logits[:, -1, :]

    def keep(self, slot: int, prompt: list[int], generated: list[int], adapter: str | None) -> None:
        """The row finishing in ``slot`` is kept in the prefix cache, if it is worth keeping: its prompt and all it
        generated but the last token (the tokens its columns hold; the list is built only for a row kept)."""
        lo = self.starts[slot]
        n = len(prompt) + len(generated) - 1
        if self.prefixes is None or lo == INACTIVE_START or self.t - lo != n or not self.prefixes.wants(slot, n):
            return
        self.prefixes.keep([*prompt, *generated[:-1]], adapter or BASE_ADAPTER, self.cache.read_row(slot, lo, self.t))

    def _make_room(self, width: int) -> None:
        """A block of ``width`` columns must end right before ``t``: shift the columns in use right if ``t`` is
        smaller."""
        if self.t < width:
            self.cache.shift_right(width - self.t, self.t)
            self._move(width - self.t)

    def _left_padded(self, prompts: list[list[int]], width: int, rows: int) -> torch.Tensor:
        """``prompts`` left-padded to ``width``, plus all-pad rows up to ``rows``: one tensor from one Python list
        (a per-row fill was a dozen ops a row, 770 at 64 rows)."""
        return torch.tensor([[self.pad_id] * (width - len(p)) + list(p) for p in prompts]
                            + [[self.pad_id] * width] * (rows - len(prompts)), dtype=torch.long)

    def _seat(self, slots: list[int], lengths: list[int], adapters: list[str]) -> None:
        """The joined rows' start columns (host and device copies) and adapters, after their prefill."""
        for s, n, name in zip(slots, lengths, adapters, strict=True):
            self.starts[s] = self.t - n
            self.adapters.slot_adapters[s] = name
            if self.prefixes is not None:
                self.prefixes.seat(s)
        index = torch.tensor(slots, dtype=torch.long, device=self.device)
        self.start.index_copy_(0, index, torch.tensor([self.starts[s] for s in slots], dtype=torch.long).to(self.device))

    def _prefill_static(self, slots: list[int], prompts: list[list[int]], rows: int, window: int) -> torch.Tensor:
        """The prefill of ``prompts`` padded to ``rows`` x ``window`` from that bucket's device buffers (a CUDA
        graph's static inputs): pad rows have length 0 and write into the scratch slot."""
        self._make_room(window)
        key = ("prefill", rows, window)
        inp = self._prefill_inputs.get(key[1:])
        if inp is None:
            dev = self.device
            inp = _PrefillInputs(torch.zeros((rows, window), dtype=torch.long, device=dev),
                                 torch.zeros(rows, dtype=torch.long, device=dev),
                                 torch.zeros(rows, dtype=torch.long, device=dev),
                                 torch.zeros((), dtype=torch.long, device=dev))
            self._prefill_inputs[key[1:]] = inp
        pad = rows - len(prompts)
        lengths = [len(p) for p in prompts]
        inp.ids.copy_(self._left_padded(prompts, window, rows))
        inp.lengths.copy_(torch.tensor(lengths + [0] * pad, dtype=torch.long))
        inp.slots.copy_(torch.tensor(slots + [self.scratch] * pad, dtype=torch.long))
        inp.first_column.fill_(self.t - window)
        if self.use_graphs and key not in self.graphs.eager:
            logits = self.graphs.replay(key, lambda: self._prefill_body(rows, window))
        else:
            logits = self._prefill_body(rows, window)
        self.stats["static_prefills"] += 1
        self._seat(slots, lengths, [BASE_ADAPTER] * len(slots))
        return logits[: len(slots)]

    def _prefill_body(self, rows: int, window: int) -> torch.Tensor:
        """A static prefill from the bucket's device buffers alone (what a CUDA graph captures)."""
        inp = self._prefill_inputs[(rows, window)]
        positions, mask = block_mask(inp.lengths, window)  # a pad row (length 0) attends to itself only
        self.cache.begin_prefill(inp.slots, inp.first_column + torch.arange(window, device=self.device))
        try:
            out = self.model(input_ids=inp.ids, attention_mask=mask, position_ids=positions,
                             past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        finally:
            self.cache.end()
        return out.logits[:, -1, :]

    def set_next_tokens(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        """The tokens that slots feed into the next decode step (device tensors, no host round trip)."""
        self.tokens.index_copy_(0, slots, tokens.view(-1, 1))

    def release(self, slots: list[int]) -> None:
        if slots:
            for s in slots:
                self.starts[s] = INACTIVE_START
                self.adapters.slot_adapters[s] = BASE_ADAPTER
            self.start.index_fill_(0, torch.tensor(slots, dtype=torch.long, device=self.device), INACTIVE_START)

    def restart(self) -> None:
        """With no slot in use, the columns start again at 0: a request alone on an idle engine then always
        uses the same columns, so its logprobs are reproducible to the bit."""
        self.t = 0

    # ------------------------------------------------------------------ decode
    def _decode_body(self, n: int, w: int) -> torch.Tensor:
        """One decode step for slots ``[0, n)`` attending to columns ``[0, w)``, from the device tensors alone."""
        t = self.step_t
        start = self.start[:n]
        cols = torch.arange(w, device=self.device)
        # a row sees its own columns [start, t]; a free slot (start far beyond t) sees only column t
        mask = ((cols[None, :] >= start[:, None]) & (cols[None, :] <= t)) | (cols[None, :] == t)
        self.column.copy_(t.view(1))
        self.cache.begin_decode(n, w, self.column)
        try:
            with self.adapters.rows(self.adapters.slot_adapters[:n]) as extra:
                out = self.model(input_ids=self.tokens[:n], attention_mask=mask[:, None, None, :],
                                 position_ids=(t - start).clamp(min=0)[:, None], past_key_values=self.cache,
                                 use_cache=True, **extra)
        finally:
            self.cache.end()
        return out.logits[:, -1, :]

    @torch.inference_mode()
    def decode(self, rows: int) -> torch.Tensor:
        """One decode step for the slots ``[0, rows)`` (padded up to a bucket); returns logits ``[>= rows, V]``.
        Advances ``t``."""
        self._compact_if_due()
        n = self.bucket(rows)
        w = window_bucket(self.t + 1, self.cache.capacity) if self.bucketed else self.t + 1
        self.step_t.fill_(self.t)
        if self.use_graphs and ("decode", n, w) not in self.graphs.eager:
            logits = self.graphs.replay(("decode", n, w), lambda: self._step_fn(n, w))
        else:
            logits = self._step_fn(n, w)
        self.t += 1
        return logits
