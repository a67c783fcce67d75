"""Memory-bounded token logprobs: the vocabulary projection is computed a chunk of rows at a time, in
forward and again in backward, so full-vocabulary logits never exist for the whole batch at once.

A hand-written autograd function rather than activation checkpointing of a plain expression: forward keeps
one log-normaliser per row, and backward recomputes each chunk's logits once and turns that buffer into the
gradient in place (``one_hot(target) - softmax``). Each chunk then costs a single ``[rows, vocab]`` buffer
and about as many full passes over it as a fused cross-entropy, so the only overhead against a plain
full-logits loss is the one recomputed matmul.

``LogprobKernels.compiled()`` (``learner.compile_logprobs``) runs each chunk's elementwise work through
``torch.compile`` instead (the matmuls stay eager): the cast, the log-normaliser and the gather in forward, the
``one_hot - softmax`` gradient and its cast in backward, each fused into a few kernels over the chunk's logits
where eager runs one kernel, and one pass over ``[rows, vocab]``, per op. The same values up to the fused
kernels' rounding (tests/learners/test_train_step_options.py); the first step compiles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def _chunk_logits(hs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (hs @ weight.t()).float()


def _chunk_forward(hs: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's (logprob of the target, log-normaliser), written out of place for ``torch.compile``."""
    logits = _chunk_logits(hs, weight)
    row_max = logits.amax(dim=-1)
    lse = (logits - row_max[:, None]).exp().sum(dim=-1).log() + row_max
    return logits.gather(-1, targets[:, None]).squeeze(-1) - lse, lse


def _chunk_grad_logits(hs: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                       g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's ``d lp / d logits`` times the upstream gradient, in the dtypes of ``hs`` and of ``weight``
    (the same tensor when they agree), written out of place for ``torch.compile``."""
    probs = (_chunk_logits(hs, weight) - lse[:, None]).exp()
    grad = (probs * -g[:, None]).scatter_add(-1, targets[:, None], g[:, None])
    for_hidden = grad.to(hs.dtype)
    return for_hidden, (for_hidden if weight.dtype == hs.dtype else grad.to(weight.dtype))


@dataclass(frozen=True)
class LogprobKernels:
    """Each chunk's work, in ``torch.compile``d form (``compiled``); None in :func:`chunked_token_logprobs` is
    the eager, in-place path (the default)."""

    forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    grad_logits: Callable[..., tuple[torch.Tensor, torch.Tensor]]

    @classmethod
    def compiled(cls) -> LogprobKernels:
        """Compiled on first use (the rows of a chunk may vary: the last chunk's count becomes dynamic)."""
        return cls(torch.compile(_chunk_forward), torch.compile(_chunk_grad_logits))


class _TokenLogprobs(torch.autograd.Function):
    """``log_softmax(hidden @ W.T * inv_temp)[target]``, ``chunk_rows`` rows at a time."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                inv_temp: torch.Tensor, chunk_rows: int, kernels: LogprobKernels | None) -> torch.Tensor:
        # (h W^T) / T == (h / T) W^T, and scaling the [N, H] rows is far cheaper than the [N, V] logits
        hs = hidden * inv_temp[:, None].to(hidden.dtype)
        n = hidden.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        for start in range(0, n, chunk_rows):
            sl = slice(start, start + chunk_rows)
            if kernels is not None:
                out[sl], lse[sl] = kernels.forward(hs[sl], weight, targets[sl])
                continue
            logits = _chunk_logits(hs[sl], weight)
            target_logit = logits.gather(-1, targets[sl, None]).squeeze(-1)
            row_max = logits.amax(dim=-1)
            # logsumexp in place: no second [rows, vocab] buffer
            lse[sl] = logits.sub_(row_max[:, None]).exp_().sum(dim=-1).log_().add_(row_max)
            out[sl] = target_logit - lse[sl]
            del logits
        ctx.save_for_backward(hs, weight, targets, inv_temp, lse)
        ctx.chunk_rows, ctx.kernels = chunk_rows, kernels
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hs, weight, targets, inv_temp, lse = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hs = torch.empty_like(hs) if need_hidden else None
        grad_weight = torch.zeros_like(weight) if need_weight else None
        g = grad_out.float()
        kernels: LogprobKernels | None = ctx.kernels
        for start in range(0, hs.shape[0], ctx.chunk_rows):
            sl = slice(start, start + ctx.chunk_rows)
            if kernels is not None:
                for_hidden, for_weight = kernels.grad_logits(hs[sl], weight, targets[sl], lse[sl], g[sl])
            else:
                for_hidden, for_weight = _grad_logits_in_place(hs[sl], weight, targets[sl], lse[sl], g[sl])
            if grad_hs is not None:
                torch.mm(for_hidden, weight.to(hs.dtype), out=grad_hs[sl])
            if grad_weight is not None:
                grad_weight.addmm_(for_weight.t(), hs[sl].to(weight.dtype))
            del for_hidden, for_weight
        grad_hidden = grad_hs * inv_temp[:, None].to(hs.dtype) if grad_hs is not None else None
        return grad_hidden, grad_weight, None, None, None, None


def _grad_logits_in_place(hs: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                          g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``d lp / d logits = one_hot(target) - softmax``, times ``g``, built in place in the recomputed logits and
    cast once per dtype the two matmuls need (once in all when ``hs`` and ``weight`` agree, as bf16 weights do)."""
    grad_logits = _chunk_logits(hs, weight)
    grad_logits.sub_(lse[:, None]).exp_().mul_(-g[:, None])
    grad_logits.scatter_add_(-1, targets[:, None], g[:, None])
    for_hidden = grad_logits.to(hs.dtype)
    return for_hidden, (for_hidden if weight.dtype == hs.dtype else grad_logits.to(weight.dtype))


def chunked_token_logprobs(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    targets: torch.Tensor,
    temperatures: torch.Tensor,
    chunk_rows: int = 1024,
    kernels: LogprobKernels | None = None,
) -> torch.Tensor:
    """``log softmax(hidden @ W.T / T)[target]`` for ``hidden`` of shape [N, H]; returns [N]. ``kernels``: each
    chunk's work compiled (:meth:`LogprobKernels.compiled`); None: eager, in place."""
    if hidden.shape[0] == 0:
        return hidden.new_zeros(0, dtype=torch.float32)
    inv_temp = 1.0 / temperatures.to(device=hidden.device, dtype=torch.float32)
    return _TokenLogprobs.apply(hidden, lm_head_weight, targets, inv_temp, max(1, int(chunk_rows)), kernels)
