"""Memory-bounded token logprobs: the vocabulary projection is computed a chunk of rows at a time, in
forward and again in backward, so full-vocabulary logits never exist for the whole batch at once.

A hand-written autograd function rather than activation checkpointing of a plain expression: forward keeps
one log-normaliser per row, and backward recomputes each chunk's logits once and turns that buffer into the
gradient in place (``one_hot(target) - softmax``). Each chunk then costs a single ``[rows, vocab]`` buffer
and about as many full passes over it as a fused cross-entropy, so the only overhead against a plain
full-logits loss is the one recomputed matmul.
"""

from __future__ import annotations

from typing import Any

import torch


def _chunk_logits(hs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (hs @ weight.t()).float()


class _TokenLogprobs(torch.autograd.Function):
    """``log_softmax(hidden @ W.T * inv_temp)[target]``, ``chunk_rows`` rows at a time."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                inv_temp: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        # (h W^T) / T == (h / T) W^T, and scaling the [N, H] rows is far cheaper than the [N, V] logits
        hs = hidden * inv_temp[:, None].to(hidden.dtype)
        n = hidden.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        for start in range(0, n, chunk_rows):
            sl = slice(start, start + chunk_rows)
            logits = _chunk_logits(hs[sl], weight)
            target_logit = logits.gather(-1, targets[sl, None]).squeeze(-1)
            row_max = logits.amax(dim=-1)
            # logsumexp in place: no second [rows, vocab] buffer
            lse[sl] = logits.sub_(row_max[:, None]).exp_().sum(dim=-1).log_().add_(row_max)
            out[sl] = target_logit - lse[sl]
            del logits
        ctx.save_for_backward(hs, weight, targets, inv_temp, lse)
        ctx.chunk_rows = chunk_rows
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hs, weight, targets, inv_temp, lse = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hs = torch.empty_like(hs) if need_hidden else None
        grad_weight = torch.zeros_like(weight) if need_weight else None
        g = grad_out.float()
        for start in range(0, hs.shape[0], ctx.chunk_rows):
            sl = slice(start, start + ctx.chunk_rows)
            # d lp / d logits = one_hot(target) - softmax, built in place in the recomputed logits
            grad_logits = _chunk_logits(hs[sl], weight)
            grad_logits.sub_(lse[sl, None]).exp_().mul_(-g[sl, None])
            grad_logits.scatter_add_(-1, targets[sl, None], g[sl, None])
            if grad_hs is not None:
                torch.mm(grad_logits.to(hs.dtype), weight.to(hs.dtype), out=grad_hs[sl])
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t().to(weight.dtype), hs[sl].to(weight.dtype))
            del grad_logits
        grad_hidden = grad_hs * inv_temp[:, None].to(hs.dtype) if grad_hs is not None else None
        return grad_hidden, grad_weight, None, None, None


def chunked_token_logprobs(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    targets: torch.Tensor,
    temperatures: torch.Tensor,
    chunk_rows: int = 1024,
) -> torch.Tensor:
    """``log softmax(hidden @ W.T / T)[target]`` for ``hidden`` of shape [N, H]; returns [N]."""
    if hidden.shape[0] == 0:
        return hidden.new_zeros(0, dtype=torch.float32)
    inv_temp = 1.0 / temperatures.to(device=hidden.device, dtype=torch.float32)
    return _TokenLogprobs.apply(hidden, lm_head_weight, targets, inv_temp, max(1, int(chunk_rows)))
