"""Per-sequence reductions over flat token tensors: ``seq_index[i]`` is the sequence of token ``i``
(``0 .. S-1`` within the tensors at hand; every sequence whole)."""

from __future__ import annotations

import torch


def sequence_count(seq_index: torch.Tensor) -> int:
    return int(seq_index.max()) + 1 if seq_index.numel() else 0


def sequence_lengths(seq_index: torch.Tensor) -> torch.Tensor:
    """The number of tokens of each token's sequence, per token (float)."""
    counts = torch.bincount(seq_index, minlength=sequence_count(seq_index)).to(torch.float64)
    return counts[seq_index]


def sequence_mean(x: torch.Tensor, seq_index: torch.Tensor) -> torch.Tensor:
    """The mean of ``x`` over each token's sequence, per token (differentiable)."""
    n = sequence_count(seq_index)
    sums = torch.zeros(n, dtype=x.dtype, device=x.device).index_add(0, seq_index, x)
    counts = torch.bincount(seq_index, minlength=n).to(x.dtype)
    return (sums / counts.clamp(min=1))[seq_index]


def sequence_index(lengths: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """``seq_index`` for sequences of these trained lengths laid out one after another (a micro-batch's
    trained tokens in row-major order)."""
    return torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                   torch.tensor(lengths, dtype=torch.long, device=device))
