"""A preallocated KV cache for a fixed pool of slots, with one write column shared by every slot.

Layout (per attention layer): keys and values of shape ``[slots, kv_heads, capacity, head_dim]``, allocated once
and only ever written in place. Every decode step writes the new token of every row at the same column ``t``, so
the write position is one scalar for the whole batch: the shape that CUDA graphs and ``index_copy_`` want. A slot
that joins at step ``t`` with an ``m``-token prompt has its prompt written into columns ``[t - m, t)`` of its own
row, so slot ``s`` holds its tokens in columns ``[start[s], t)``. Attention looks at the window ``[0, w)`` with
``w > t`` and masks each row to its own columns; RoPE was applied before the keys were cached and position ids
are per row (``t - start[s]``), so a row's outputs do not depend on where its columns are.

The columns in use are kept at the front of the cache, so the window stays short:
- ``compact(lo)`` moves columns ``[lo, t)`` to ``[0, t - lo)`` (``lo``: the smallest start of a row in use); the
  runner does it when ``t`` reaches the capacity, or when the unused prefix is half the window;
- ``shift_right(d)`` makes room before ``t`` for a prompt longer than ``t``;
- ``grow`` reallocates with more columns when a request needs more than the capacity.

A row whose prompt starts with a kept prefix (``prefix_cache.py``) has the prefix's keys and values copied into its
columns (``write_row``), and then only the rest of its prompt runs (the EXTEND phase: it attends to the prefix and
to itself); a finished row's columns are copied out with ``read_row``.

``SlotKVCache`` is a transformers ``Cache``: the model's attention layers call ``update``, which writes where the
current phase says and returns the keys and values to attend to.
"""

from __future__ import annotations

import enum
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

INACTIVE_START = 2**62  # the start column of a free slot: it attends to the written column only


def slot_cache_fits(config: Any) -> str | None:
    """Why the slot KV cache cannot serve this model (None when it can): it holds full-attention layers only."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        return f"layer types {sorted(kinds)}"
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        return f"sliding window {text.sliding_window}"
    if getattr(text, "is_encoder_decoder", False):
        return "an encoder-decoder model"
    return None


class Phase(enum.Enum):
    IDLE = "idle"
    PREFILL = "prefill"  # a block of joining rows: write their prompts, attend to the block itself
    DECODE = "decode"  # rows [0, n): write column t, attend to the window [0, w) (masked per row)
    EXTEND = "extend"  # one row: write the new tokens at [lo + p, t), attend to its columns [lo, t)


class SlotLayer(CacheLayerMixin):
    """One attention layer's slots x columns. Written in place: its tensors never move (CUDA graphs)."""

    is_compileable = True
    is_sliding = False
    keys: torch.Tensor  # allocated in __init__ (the base class allows None until a lazy first update)
    values: torch.Tensor

    def __init__(self, owner: SlotKVCache, shape: tuple[int, int, int, int], dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        self.owner = owner
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.dtype, self.device = dtype, device
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("SlotLayer is allocated up front")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        o = self.owner
        if o.phase is Phase.DECODE:
            # [n, H, 1, D] into column t of rows [0, n); attend over the window [0, w) of those rows
            keys, values = self.keys[: o.rows, :, : o.window], self.values[: o.rows, :, : o.window]
            keys.index_copy_(2, o.column, key_states)
            values.index_copy_(2, o.column, value_states)
            return keys, values
        if o.phase is Phase.PREFILL:
            # [k, H, P, D] into the joining rows at the block's columns; attention sees only the block.
            # Advanced indices on dims 0 and 2 around a slice: the indexed view is [k, P, H, D].
            rows, cols = o.slot_index[:, None], o.columns[None, :]
            self.keys[rows, :, cols] = key_states.transpose(1, 2)
            self.values[rows, :, cols] = value_states.transpose(1, 2)
            return key_states, value_states
        if o.phase is Phase.EXTEND:
            # [1, H, m, D] after the row's p kept columns; attention sees the row's columns [lo, t)
            s, lo, t = o.extend_row
            m = key_states.shape[2]
            self.keys[s, :, t - m : t].copy_(key_states[0])
            self.values[s, :, t - m : t].copy_(value_states[0])
            return self.keys[s : s + 1, :, lo:t], self.values[s : s + 1, :, lo:t]
        raise RuntimeError("SlotKVCache.update called outside a prefill, decode or extend phase")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # a prefill attends to its block alone: with no padding and no mask given, transformers then leaves the mask
        # out and SDPA runs its causal kernel (``is_causal``)
        if self.owner.phase is Phase.PREFILL:
            return query_length, 0
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        return 0  # unused: the engine always passes position ids and a 4D mask

    def get_max_length(self) -> int:
        return self.keys.shape[2]


def kv_shape(config: Any) -> tuple[int, int, int]:
    """(layers, kv heads, head dim) of a transformers config."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    kv_heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
    return int(text.num_hidden_layers), kv_heads, head_dim


class SlotKVCache(Cache):
    """The KV cache of ``slots`` rows x ``capacity`` columns for every attention layer of ``config``."""

    def __init__(self, config: Any, slots: int, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        n_layers, kv_heads, head_dim = kv_shape(config)
        self.slots, self.capacity = slots, capacity
        self.dtype, self.device = dtype, device
        self.slot_layers = [SlotLayer(self, (slots, kv_heads, capacity, head_dim), dtype, device)
                            for _ in range(n_layers)]  # self.layers, with their type
        super().__init__(layers=[*self.slot_layers])
        self.phase = Phase.IDLE
        self.rows = 0  # DECODE: rows [0, rows) take part
        self.window = 0  # DECODE: columns [0, window) are attended to
        self.column = torch.zeros(1, dtype=torch.long, device=device)  # DECODE: the column written
        self.slot_index = torch.zeros(0, dtype=torch.long, device=device)  # PREFILL: the joining slots
        self.columns = torch.zeros(0, dtype=torch.long, device=device)  # PREFILL: the block's columns
        self.extend_row = (0, 0, 0)  # EXTEND: (slot, the row's first column, t)

    @property
    def bytes(self) -> int:
        return sum(2 * layer.keys.numel() * layer.keys.element_size() for layer in self.slot_layers)

    @staticmethod
    def bytes_for(config: Any, slots: int, capacity: int, dtype: torch.dtype) -> int:
        n_layers, kv_heads, head_dim = kv_shape(config)
        return 2 * n_layers * slots * kv_heads * capacity * head_dim * dtype.itemsize

    # ------------------------------------------------------------------ moving columns (in place)
    def _tensors(self) -> list[torch.Tensor]:
        return [t for layer in self.slot_layers for t in (layer.keys, layer.values)]

    def compact(self, lo: int, t: int) -> None:
        """Columns ``[lo, t)`` -> ``[0, t - lo)``, in every slot."""
        if lo <= 0:
            return
        for x in self._tensors():
            x[:, :, : t - lo].copy_(x[:, :, lo:t].clone())

    def shift_right(self, d: int, t: int) -> None:
        """Columns ``[0, t)`` -> ``[d, t + d)``, in every slot."""
        if d <= 0:
            return
        for x in self._tensors():
            x[:, :, d : t + d].copy_(x[:, :, :t].clone())

    def grow(self, capacity: int, t: int) -> None:
        """Reallocate with ``capacity`` columns, keeping columns ``[0, t)`` (the tensors move: CUDA graphs that
        read them must be captured again)."""
        if capacity <= self.capacity:
            return
        # everything is allocated before anything is replaced: a failed allocation leaves the cache as it was
        grown = [[torch.zeros((*src.shape[:2], capacity, src.shape[3]), dtype=src.dtype, device=src.device)
                  for src in (layer.keys, layer.values)] for layer in self.slot_layers]
        for layer, (keys, values) in zip(self.slot_layers, grown, strict=True):
            keys[:, :, :t].copy_(layer.keys[:, :, :t])
            values[:, :, :t].copy_(layer.values[:, :, :t])
            layer.keys, layer.values = keys, values
        self.capacity = capacity

    # ------------------------------------------------------------------ one row's columns (kept prefixes)
    def read_row(self, slot: int, lo: int, hi: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A copy of ``slot``'s columns ``[lo, hi)``, per layer: keys and values ``[kv_heads, hi - lo, head_dim]``."""
        return [(layer.keys[slot, :, lo:hi].clone(), layer.values[slot, :, lo:hi].clone())
                for layer in self.slot_layers]

    def write_row(self, slot: int, lo: int, kv: list[tuple[torch.Tensor, torch.Tensor]], n: int) -> None:
        """The first ``n`` columns of ``kv`` (``read_row``'s shape) into ``slot``'s columns ``[lo, lo + n)``."""
        for layer, (keys, values) in zip(self.slot_layers, kv, strict=True):
            layer.keys[slot, :, lo : lo + n].copy_(keys[:, :n])
            layer.values[slot, :, lo : lo + n].copy_(values[:, :n])

    # ------------------------------------------------------------------ phases (set by the runner)
    def begin_prefill(self, slot_index: torch.Tensor, columns: torch.Tensor) -> None:
        self.phase, self.slot_index, self.columns = Phase.PREFILL, slot_index, columns

    def begin_decode(self, rows: int, window: int, column: torch.Tensor) -> None:
        self.phase, self.rows, self.window, self.column = Phase.DECODE, rows, window, column

    def begin_extend(self, slot: int, lo: int, t: int) -> None:
        self.phase, self.extend_row = Phase.EXTEND, (slot, lo, t)

    def end(self) -> None:
        self.phase = Phase.IDLE
