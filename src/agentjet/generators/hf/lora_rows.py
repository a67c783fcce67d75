"""Per-row LoRA: rows of different named adapters in one forward, for about the cost of one adapter.

PEFT's own mixed batch (``adapter_names``) loops over the adapters in every LoRA layer: it picks each one's rows
with a host-built index, runs that adapter on them and scatters the result back, so a forward costs a few
small ops per adapter per layer, plus forward hooks registered and removed on every call. On a CPU with
SmolLM2-135M that made 4 mixed adapters 0.67x the tokens/s of one (``benchmarks/serving/adapters.py``).

Here every LoRA ``Linear`` keeps one persistent forward hook, idle unless a forward runs inside ``rows(names)``
(one adapter name per row of the batch; PEFT's ``__base__`` for a row that no adapter touches). Inside it the
PEFT layers are switched to their base weights and the hook adds, to each layer's output:

- all rows on one adapter ``u``: ``B_u(A_u(x)) * scaling_u`` (PEFT's own op order), times a 0/1 row mask when
  some rows are the base;
- rows on several adapters: ``((x @ A_cat^T) * M) @ B_cat^T``, where ``A_cat`` and ``B_cat`` stack every adapter
  of the layer along the rank (``sum r`` is small) and ``M[row]`` holds ``scaling_u`` on the rank columns of the
  row's adapter ``u`` and 0 elsewhere. Three dense ops for any number of adapters; the stacked copies are kept
  per layer and made again only when a weight changed (a train step, a load: the tensors' version counters) or
  the adapters did.

Only plain LoRA on ``Linear`` layers (no DoRA or other variants, no LoRA bias, no ``fan_in_fan_out``):
:func:`unsupported` says why a model is not, and the runner then uses PEFT's ``adapter_names``. Outside
``rows`` (the learner's forwards) the hooks return at once and PEFT runs as usual.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from agentjet.settings.learner import BASE_ADAPTER

log = logging.getLogger(__name__)

Layout = tuple[tuple[str, int, float], ...]  # (adapter, rank, scaling) of each stacked adapter, in order


def lora_layers(peft_model: Any) -> list[Any]:
    """Every LoRA layer (PEFT's ``LoraLayer``) of the model, in module order."""
    from peft.tuners.lora.layer import LoraLayer

    return [m for m in peft_model.modules() if isinstance(m, LoraLayer)]


def unsupported(peft_model: Any) -> str | None:
    """Why :class:`RowLoRA` cannot serve this model's adapters (None when it can)."""
    from peft.tuners.lora.layer import Linear

    for layer in lora_layers(peft_model):
        if not isinstance(layer, Linear):
            return f"a LoRA layer of type {type(layer).__name__} (only Linear layers)"
        if layer.lora_variant:
            return f"LoRA variants {sorted(layer.lora_variant)} (DoRA and the like)"
        if any(layer.lora_bias.values()):
            return "a LoRA bias"
        if layer.fan_in_fan_out:
            return "fan_in_fan_out weights"
    return None


@dataclass
class _Plan:
    """One forward's rows: each one's adapter, and the masks made from them (once per forward)."""

    names: list[str]
    present: list[str]  # the adapters some row uses, in first-row order
    all_rows: bool  # every row uses the one adapter present (no base row)
    masks: dict[tuple[Layout, torch.device, torch.dtype], torch.Tensor] = field(default_factory=dict)
    row_masks: dict[tuple[str, torch.device, torch.dtype], torch.Tensor] = field(default_factory=dict)

    @classmethod
    def of(cls, names: Sequence[str]) -> _Plan:
        present = list(dict.fromkeys(n for n in names if n != BASE_ADAPTER))
        return cls(list(names), present, len(present) == 1 and BASE_ADAPTER not in names)

    def row_mask(self, adapter: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """``[rows, 1, 1]``: 1 for the rows of ``adapter``, 0 for the others."""
        key = (adapter, device, dtype)
        if key not in self.row_masks:
            flags = torch.tensor([float(n == adapter) for n in self.names], dtype=dtype)
            self.row_masks[key] = flags.view(-1, 1, 1).to(device)
        return self.row_masks[key]

    def mask(self, layout: Layout, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """``[rows, 1, sum of ranks]``: the row's adapter's scaling on its rank columns, 0 elsewhere."""
        key = (layout, device, dtype)
        if key not in self.masks:
            spans: dict[str, tuple[int, int, float]] = {}
            offset = 0
            for name, rank, scaling in layout:
                spans[name] = (offset, offset + rank, scaling)
                offset += rank
            mask = torch.zeros((len(self.names), 1, offset), dtype=dtype)
            for i, name in enumerate(self.names):
                if name in spans:
                    lo, hi, scaling = spans[name]
                    mask[i, 0, lo:hi] = scaling
            self.masks[key] = mask.to(device)
        return self.masks[key]


@dataclass
class _Stacked:
    key: tuple[Any, ...]  # what it was made from: names, tensors and their version counters
    layout: Layout
    a: torch.Tensor  # [sum r, in]
    b: torch.Tensor  # [out, sum r]


class RowLoRA:
    """The per-row LoRA of one PEFT model with named adapters (see the module's docstring). Run every forward
    that mixes adapters inside :meth:`rows`, on the thread that owns the module; call :meth:`refresh` after adding
    or removing an adapter."""

    def __init__(self, peft_model: Any) -> None:
        reason = unsupported(peft_model)
        if reason is not None:
            raise ValueError(f"per-row LoRA cannot serve this model: {reason}")
        self.model = peft_model
        self._layers: list[Any] = []
        self._handles: list[Any] = []
        self._stacked: dict[int, _Stacked] = {}
        self._plan: _Plan | None = None
        self.refresh()

    def refresh(self) -> None:
        """Find the LoRA layers again and hook each one (after an adapter was added or removed)."""
        for handle in self._handles:
            handle.remove()
        self._layers = lora_layers(self.model)
        self._handles = [layer.register_forward_hook(functools.partial(self._hook, i), with_kwargs=True)
                         for i, layer in enumerate(self._layers)]
        self._stacked.clear()

    @property
    def stacked_bytes(self) -> int:
        """Memory held by the stacked copies of the adapters' weights (made by the first mixed forward)."""
        return sum(s.a.numel() * s.a.element_size() + s.b.numel() * s.b.element_size() for s in self._stacked.values())

    @contextlib.contextmanager
    def rows(self, names: Sequence[str]) -> Iterator[None]:
        """Forwards in this block run row ``i`` with adapter ``names[i]`` (``__base__``: none)."""
        saved = [layer._disable_adapters for layer in self._layers]
        for layer in self._layers:
            layer._disable_adapters = True  # PEFT's layers give their base output; the hooks add the adapters
        self._plan = _Plan.of(names)
        try:
            yield
        finally:
            self._plan = None
            for layer, flag in zip(self._layers, saved, strict=True):
                layer._disable_adapters = flag

    # ------------------------------------------------------------------ the hook
    def _hook(self, index: int, layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              output: torch.Tensor) -> torch.Tensor | None:
        plan = self._plan
        if plan is None or not plan.present:
            return None  # not a mixed forward (or every row is the base): PEFT's own output
        x = args[0] if args else kwargs["x"]
        delta = self._single(layer, x, plan) if len(plan.present) == 1 else self._mixed(index, layer, x, plan)
        return output if delta is None else output + delta.to(output.dtype)

    def _single(self, layer: Any, x: torch.Tensor, plan: _Plan) -> torch.Tensor | None:
        name = plan.present[0]
        if name not in layer.lora_A:
            return None
        a, b = layer.lora_A[name], layer.lora_B[name]
        delta = b(a(x.to(a.weight.dtype))) * layer.scaling[name]
        return delta if plan.all_rows else delta * plan.row_mask(name, delta.device, delta.dtype)

    def _mixed(self, index: int, layer: Any, x: torch.Tensor, plan: _Plan) -> torch.Tensor:
        stacked = self._stack(index, layer)
        h = F.linear(x.to(stacked.a.dtype), stacked.a)
        h = h * plan.mask(stacked.layout, h.device, h.dtype)
        return F.linear(h, stacked.b)

    def _stack(self, index: int, layer: Any) -> _Stacked:
        """Every adapter of ``layer`` stacked along the rank, made again only when a weight or the set changed."""
        names = list(layer.lora_A)
        weights = [(layer.lora_A[n].weight, layer.lora_B[n].weight) for n in names]
        key = tuple((n, a.data_ptr(), a._version, b.data_ptr(), b._version)
                    for n, (a, b) in zip(names, weights, strict=True))
        stacked = self._stacked.get(index)
        if stacked is None or stacked.key != key:
            layout = tuple((n, int(layer.r[n]), float(layer.scaling[n])) for n in names)
            with torch.no_grad():
                a_cat = torch.cat([a.detach() for a, _ in weights], dim=0)
                b_cat = torch.cat([b.detach() for _, b in weights], dim=1)
            stacked = self._stacked[index] = _Stacked(key, layout, a_cat, b_cat)
        return stacked


def mixed_rows(model: torch.nn.Module) -> tuple[RowLoRA | None, str | None]:
    """How mixed-adapter batches run: the per-row LoRA, or (when it cannot serve the model) PEFT's adapter_names,
    with the reason."""
    reason = unsupported(model)
    if reason is None:
        return RowLoRA(model), None
    log.warning("mixed-adapter batches through PEFT's adapter_names (slower): the per-row LoRA does not support %s",
                reason)
    return None, reason


class RowAdapters:
    """The adapter of each slot's row, and how the rows of one forward run their adapters: through the per-row LoRA,
    or PEFT's ``adapter_names`` for a model it does not serve (``mixed``: the model has named adapters; else every
    forward is the model's own)."""

    def __init__(self, model: torch.nn.Module, slots: int, mixed: bool) -> None:
        self.mixed = mixed
        self.slot_adapters = [BASE_ADAPTER] * slots  # the adapter of each slot's row
        self.row_lora, self.peft_rows_reason = mixed_rows(model) if mixed else (None, None)
        self.prefer_peft_rows = False  # run mixed batches through PEFT's adapter_names (benchmarks compare)

    @property
    def mixed_batches(self) -> str | None:
        """How rows of different adapters share a forward (None: the model has no named adapters)."""
        if not self.mixed:
            return None
        if self.row_lora is not None and not self.prefer_peft_rows:
            return "per-row LoRA (stacked adapters, row mask)"
        return "PEFT adapter_names" + (f" ({self.peft_rows_reason})" if self.peft_rows_reason else "")

    def refresh(self) -> None:
        """An adapter was added or removed (on the worker thread): the per-row LoRA finds its layers again."""
        if self.row_lora is not None:
            self.row_lora.refresh()

    @contextlib.contextmanager
    def rows(self, names: list[str]) -> Iterator[dict[str, Any]]:
        """A forward inside this block runs row ``i`` with adapter ``names[i]``; it yields the extra forward
        arguments (PEFT's ``adapter_names`` when PEFT mixes the rows, else none)."""
        if not self.mixed:
            yield {}
        elif self.row_lora is not None and not self.prefer_peft_rows:
            with self.row_lora.rows(names):
                yield {}
        else:
            yield {"adapter_names": names}
