"""Weights between the trainer group and the rollout engine: one safetensors file per policy version.

Rank 0 writes the full state dict (gathered by every rank) to a temporary name and renames it, so a reader
never sees half a file. The rollout engine copies it into its live parameters in place
(:func:`copy_weights_into`), which keeps every reference to them valid (optimizer, CUDA graphs, PEFT).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


def tied_keys(model: torch.nn.Module) -> set[str]:
    """State-dict keys that alias another parameter (a tied output embedding): not written, not required."""
    config = getattr(model, "config", None)
    return {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()


def write_weights(state: dict[str, torch.Tensor], path: Path, skip: set[str] = frozenset()) -> Path:
    """Write ``state`` (minus ``skip``) as safetensors at ``path``, atomically."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file({k: v.detach().contiguous() for k, v in state.items() if k not in skip}, str(tmp),
              metadata={"format": "pt"})
    os.replace(tmp, path)
    return path


@torch.no_grad()
def copy_weights_into(model: torch.nn.Module, path: Path) -> int:
    """Copy the tensors of the safetensors file ``path`` into ``model``'s parameters and buffers in place
    (cast to each one's dtype and device). The file must cover every parameter (tied ones excepted) and hold
    nothing else; shapes must match. Returns the number of tensors copied."""
    from safetensors import safe_open

    own = model.state_dict(keep_vars=True)
    required = {k for k, _ in model.named_parameters()} - tied_keys(model)
    with safe_open(str(path), framework="pt", device="cpu") as f:
        names = sorted(f.keys())
        unexpected = sorted(set(names) - set(own))
        missing = sorted(required - set(names))
        if unexpected or missing:
            raise ValueError(f"weights {path} do not fit the model: missing={missing[:5]} unexpected={unexpected[:5]}")
        for name in names:  # every check before the first copy: a bad file leaves the model untouched
            shape = tuple(f.get_slice(name).get_shape())
            if shape != tuple(own[name].shape):
                raise ValueError(f"weights {path}: {name} has shape {shape}, the model {tuple(own[name].shape)}")
        for name in names:
            dst = own[name]
            dst.copy_(f.get_tensor(name).to(device=dst.device, dtype=dst.dtype))
    return len(names)
