"""Batched token sampling with per-row parameters. Pure torch, no engine state."""

from __future__ import annotations

import torch

from agentjet.engines.base import SamplingParams

# Candidates looked at before the full sort: the nucleus of a language model's next-token distribution is
# almost always inside its top few hundred tokens, and a top-k of them costs a fraction of sorting the vocabulary
# (CPU, 8 x 49152: 2 ms against 49 ms).
PARTIAL_CANDIDATES = 256


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask logits outside each row's top-k / top-p nucleus with -inf. ``top_k == 0`` disables top-k.

    A token is kept when its rank is below top-k and the probability mass strictly before it (in descending
    order) is below top-p; the most likely token is always kept. The top ``PARTIAL_CANDIDATES`` tokens settle
    it for a row unless its last candidate is still kept; such rows are sorted in full (``_filter_sorted``)."""
    n, vocab = logits.shape
    k = min(vocab, PARTIAL_CANDIDATES)
    values, idx = logits.topk(k, dim=-1)
    probs = (values - logits.logsumexp(dim=-1, keepdim=True)).exp()  # the candidates' true probabilities
    limit = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    keep = _keep(probs, limit, top_p)
    out = torch.full_like(logits, float("-inf")).scatter_(-1, idx, values.masked_fill(~keep, float("-inf")))
    unsettled = keep[:, -1] & (limit > k)
    if bool(unsettled.any()):
        rows = unsettled.nonzero().squeeze(-1)
        out[rows] = _filter_sorted(logits[rows], limit[rows], top_p[rows])
    return out


def _keep(sorted_probs: torch.Tensor, limit: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    ranks = torch.arange(sorted_probs.shape[-1], device=sorted_probs.device).expand_as(sorted_probs)
    cum_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly before each token
    # top-p 1 keeps everything (the rounding of a cumulative sum must not drop the last tokens)
    keep = (ranks < limit[:, None]) & ((cum_before < top_p[:, None]) | (top_p[:, None] >= 1))
    keep[:, 0] = True  # always keep the most likely token
    return keep


def _filter_sorted(logits: torch.Tensor, limit: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    keep = _keep(sorted_logits.softmax(dim=-1), limit, top_p)
    return torch.empty_like(logits).scatter_(-1, sorted_idx, sorted_logits.masked_fill(~keep, float("-inf")))


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
    temperatures = [p.logprob_temperature for p in params]
    scaled = logits
    if any(t != 1.0 for t in temperatures):
        scaled = logits / torch.tensor(temperatures, dtype=logits.dtype, device=logits.device)[:, None]
    logp = scaled.log_softmax(dim=-1)
    needs_filter = any(p.top_p < 1.0 or p.top_k > 0 for p in params)
    sample_logits = scaled
    if needs_filter:
        top_k = torch.tensor([p.top_k for p in params], device=logits.device)
        top_p = torch.tensor([p.top_p for p in params], dtype=logits.dtype, device=logits.device)
        sample_logits = filter_top_k_top_p(scaled, top_k, top_p)
    tokens = _draw(sample_logits, params, generators)
    greedy = [i for i, p in enumerate(params) if p.temperature == 0]
    if greedy:
        tokens[greedy] = logits[greedy].argmax(dim=-1)
    chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)
    top = None
    if top_logprobs > 0:
        values, ids = logp.topk(top_logprobs, dim=-1)
        top = (values, ids)
    return tokens, chosen, top


def _draw(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]) -> torch.Tensor:
    """One token per row from ``softmax(logits)`` by inverse-CDF sampling: a single uniform per row from
    that row's generator (so a seed reproduces its tokens whatever the batch), then one batched cumsum and
    searchsorted. On CPU this is ~10x cheaper than a per-row ``torch.multinomial`` over a 49k vocabulary.
    Tokens with zero probability (filtered by top-k / top-p) can never be drawn: the CDF is flat there."""
    u = torch.stack([
        torch.rand((), generator=g, dtype=torch.float64, device=g.device) if p.temperature > 0
        else torch.zeros((), dtype=torch.float64, device=g.device)
        for p, g in zip(params, generators, strict=True)
    ]).to(logits.device)
    # a float64 cumsum keeps the CDF exact enough for the last tokens of a large vocabulary (converted first:
    # cumsum(dtype=float64) of a float32 tensor is several times slower on CPU)
    cdf = logits.softmax(dim=-1).double().cumsum(dim=-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)
    return idx.clamp_(max=logits.shape[-1] - 1)
