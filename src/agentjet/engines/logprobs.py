"""Memory-bounded token logprobs: the vocabulary projection is computed a chunk of rows at a time and
recomputed in backward (activation checkpointing), so full-vocabulary logits never exist for the whole
batch at once."""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def _chunk_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, inv_temp: torch.Tensor):
    logits = (hidden @ weight.t()).float() * inv_temp[:, None]
    return logits.gather(-1, targets[:, None]).squeeze(-1) - logits.logsumexp(dim=-1)


def chunked_token_logprobs(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    targets: torch.Tensor,
    temperatures: torch.Tensor,
    chunk_rows: int = 1024,
) -> torch.Tensor:
    """``log softmax(hidden @ W.T / T)[target]`` for ``hidden`` of shape [N, H]; returns [N]."""
    inv_temp = 1.0 / temperatures.to(torch.float32)
    outs = []
    for start in range(0, hidden.shape[0], chunk_rows):
        sl = slice(start, start + chunk_rows)
        args = (hidden[sl], lm_head_weight, targets[sl], inv_temp[sl])
        if torch.is_grad_enabled():
            outs.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            outs.append(_chunk_logprobs(*args))
    if not outs:
        return hidden.new_zeros(0, dtype=torch.float32)
    return torch.cat(outs)
