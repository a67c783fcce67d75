"""A preallocated KV cache for a fixed pool of slots, laid out as one ring of columns shared by every slot.

Layout (per attention layer): keys and values of shape ``[slots, kv_heads, capacity, head_dim]``, allocated once.
Every decode step writes the new token of every row at the same column ``t mod capacity`` (``t`` is an absolute,
ever-growing step counter), so the write position is one scalar for the whole batch: the shape that CUDA graphs
and ``index_copy_`` want. A slot that joins at step ``t`` with an ``m``-token prompt has its prompt written into
columns ``(t - m .. t - 1) mod capacity`` of its own row. A slot's row therefore holds its tokens in the ``len``
newest columns of the ring, where ``len = t - start`` and ``start`` is the absolute column of its first token.

A column's *age* is ``(t - column) mod capacity`` (0 for the column being written); it is the same for every row.
Row ``s`` attends to the columns with ``age <= t - start[s]``: its own tokens and nothing else. Attention is a
sum over keys, so the ring's order does not matter, and RoPE was applied before the keys were cached (position
ids are per row: ``t - start[s]``). A row never needs more columns than its own length, so the ring never has
to be compacted; it grows (doubling, rotated so that every row stays contiguous) only when a request needs more
than ``capacity`` columns in total.

``SlotKVCache`` is a transformers ``Cache``: the model's attention layers call ``update``, which writes where the
current phase says (``prefill_rows`` or ``decode_rows``) and returns the keys and values to attend to.
"""

from __future__ import annotations

import enum
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

INACTIVE_START = 2**62  # the start column of a free slot: its length clamps to 0, so it attends to one column


class Phase(enum.Enum):
    IDLE = "idle"
    PREFILL = "prefill"  # a block of joining rows: write their prompts, attend to the block itself
    DECODE = "decode"  # rows [0, n): write one column, attend to the whole ring (masked per row)


class SlotLayer(CacheLayerMixin):
    """One attention layer's ring of columns. Written in place: its tensors never move (CUDA graphs)."""

    is_compileable = True
    is_sliding = False

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
            # [n, H, 1, D] into column t of rows [0, n); attend over the whole ring of those rows
            keys, values = self.keys[: o.rows], self.values[: o.rows]
            keys.index_copy_(2, o.column, key_states)
            values.index_copy_(2, o.column, value_states)
            return keys, values
        if o.phase is Phase.PREFILL:
            # [k, H, P, D] into the joining rows at the block's columns; attention sees only the block
            # advanced indices on dims 0 and 2 around a slice: the indexed view is [k, P, H, D]
            rows, cols = o.slot_index[:, None], o.columns[None, :]
            self.keys[rows, :, cols] = key_states.transpose(1, 2)
            self.values[rows, :, cols] = value_states.transpose(1, 2)
            return key_states, value_states
        raise RuntimeError("SlotKVCache.update called outside a prefill or decode phase")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        return 0  # unused: the engine always passes position ids and a 4D mask

    def get_max_length(self) -> int:
        return self.keys.shape[2]


class SlotKVCache(Cache):
    """The ring KV cache of ``slots`` rows x ``capacity`` columns for every attention layer of ``config``."""

    def __init__(self, config: Any, slots: int, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        n_layers = int(text.num_hidden_layers)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
        self.slots, self.capacity = slots, capacity
        self.dtype, self.device = dtype, device
        self._kv_shape = (kv_heads, head_dim)
        layers = [SlotLayer(self, (slots, kv_heads, capacity, head_dim), dtype, device) for _ in range(n_layers)]
        super().__init__(layers=layers)
        self.phase = Phase.IDLE
        self.rows = 0  # DECODE: rows [0, rows) take part
        self.column = torch.zeros(1, dtype=torch.long, device=device)  # DECODE: the column written (static)
        self.slot_index = torch.zeros(0, dtype=torch.long, device=device)  # PREFILL: the joining slots
        self.columns = torch.zeros(0, dtype=torch.long, device=device)  # PREFILL: the block's columns

    @property
    def bytes(self) -> int:
        return sum(2 * layer.keys.numel() * layer.keys.element_size() for layer in self.layers)

    @staticmethod
    def bytes_for(config: Any, slots: int, capacity: int, dtype: torch.dtype) -> int:
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        kv_heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
        return 2 * int(text.num_hidden_layers) * slots * kv_heads * capacity * head_dim * dtype.itemsize

    def grow(self, capacity: int, t: int) -> None:
        """Reallocate with ``capacity`` columns. The ring is rotated so that column ``t mod new`` follows the
        newest column, which keeps every row's tokens contiguous in the new ring."""
        old = self.capacity
        if capacity <= old:
            return
        head = t % old  # the column t would be written to: the oldest column of the old ring
        new_head = t % capacity
        for layer in self.layers:
            for name in ("keys", "values"):
                src: torch.Tensor = getattr(layer, name)
                dst = torch.zeros((*src.shape[:2], capacity, src.shape[3]), dtype=src.dtype, device=src.device)
                # ages 1..old live at old columns (head - age) mod old; put them at (new_head - age) mod capacity
                ages = torch.arange(1, old + 1, device=src.device)
                dst.index_copy_(2, (new_head - ages) % capacity, src.index_select(2, (head - ages) % old))
                setattr(layer, name, dst)
        self.capacity = capacity

    # ------------------------------------------------------------------ phases (set by the runner)
    def begin_prefill(self, slot_index: torch.Tensor, columns: torch.Tensor) -> None:
        self.phase, self.slot_index, self.columns = Phase.PREFILL, slot_index, columns

    def begin_decode(self, rows: int, column: torch.Tensor) -> None:
        self.phase, self.rows, self.column = Phase.DECODE, rows, column

    def end(self) -> None:
        self.phase = Phase.IDLE
