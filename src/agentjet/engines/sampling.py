"""Batched token sampling with per-row parameters. Pure torch, no engine state."""

from __future__ import annotations

import torch

from agentjet.engines.base import SamplingParams


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask logits outside each row's top-k / top-p nucleus with -inf. ``top_k == 0`` disables top-k."""
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    remove = ranks >= k[:, None]
    probs = sorted_logits.softmax(dim=-1)
    cum_before = probs.cumsum(dim=-1) - probs  # mass strictly before each token
    remove |= cum_before >= top_p[:, None]
    remove[:, 0] = False  # always keep the most likely token
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_idx, sorted_logits)


def sample_next(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator],
    top_logprobs: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Sample one token per row.

    Returns the tokens, their logprobs under ``log_softmax(logits / T)`` (T = 1 for greedy rows; the
    distribution the trainer reproduces), and optionally the top-``top_logprobs`` (logprobs, ids).
    """
    logits = logits.float()
    temps = torch.tensor([p.logprob_temperature for p in params], dtype=logits.dtype, device=logits.device)
    scaled = logits / temps[:, None]
    logp = scaled.log_softmax(dim=-1)
    needs_filter = any(p.top_p < 1.0 or p.top_k > 0 for p in params)
    sample_logits = scaled
    if needs_filter:
        top_k = torch.tensor([p.top_k for p in params], device=logits.device)
        top_p = torch.tensor([p.top_p for p in params], dtype=logits.dtype, device=logits.device)
        sample_logits = filter_top_k_top_p(scaled, top_k, top_p)
    probs = sample_logits.softmax(dim=-1)
    tokens = torch.empty(len(params), dtype=torch.long, device=logits.device)
    for i, p in enumerate(params):
        if p.temperature == 0:
            tokens[i] = int(logits[i].argmax())
        else:
            tokens[i] = torch.multinomial(probs[i], 1, generator=generators[i])[0]
    chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)
    top = None
    if top_logprobs > 0:
        values, ids = logp.topk(top_logprobs, dim=-1)
        top = (values, ids)
    return tokens, chosen, top
