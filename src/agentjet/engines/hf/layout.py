"""Weight layout for CPU decoding.

``nn.Linear`` keeps its weight as ``[out, in]`` row-major and computes ``x @ W.T``. For the few rows of a
decode step (1 to a few dozen), the CPU BLAS runs that transposed product well below what the same product
takes when the weight is stored ``[in, out]`` row-major (docs/benchmarks.md has the measurements). So on CPU the
engine stores each linear weight column-major: the parameter is still an ``[out, in]`` tensor with the same
values (a transposed view of an ``[in, out]`` buffer), and ``x @ W.T`` becomes the fast product. Nothing else
changes: autograd keeps gradients and optimizer state in the same layout, and ``contiguous_state_dict`` is
what a checkpoint saves.
"""

from __future__ import annotations

import torch


def column_major_linears(model: torch.nn.Module) -> int:
    """Store every linear weight of ``model`` column-major, in place of the old storage; returns how many.
    A weight shared by several modules (tied embeddings) is converted once, for all of them."""
    seen: set[int] = set()
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, torch.nn.Linear) or weight is None or id(weight) in seen:
            continue
        seen.add(id(weight))
        if weight.dim() == 2 and weight.stride() == (weight.shape[1], 1):
            weight.data = weight.data.t().contiguous().t()
    return len(seen)


def is_column_major(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Linear) and m.weight.dim() == 2 and m.weight.stride(0) == 1
               and m.weight.shape[1] > 1 for m in model.modules())


def contiguous_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with every tensor contiguous (safetensors stores row-major tensors only); tied
    tensors stay one tensor."""
    copies: dict[tuple[int, tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}
    out = {}
    for key, value in model.state_dict().items():
        same = (value.data_ptr(), tuple(value.shape), value.stride())
        if same not in copies:
            copies[same] = value.contiguous()
        out[key] = copies[same]
    return out
