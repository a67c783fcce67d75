"""The sampler: the partial (top-k candidates) nucleus filter equals the full-sort one, and inverse-CDF draws
never pick a filtered token."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentjet.engines.base import SamplingParams
from agentjet.engines.sampling import _filter_sorted, filter_top_k_top_p, sample_next


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), scale=st.sampled_from([0.5, 3.0, 10.0, 30.0]), rows=st.integers(1, 6),
       vocab=st.sampled_from([50, 300, 2000]), data=st.data())
def test_partial_filter_equals_the_full_sort(seed: int, scale: float, rows: int, vocab: int, data) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * scale
    top_k = torch.tensor(data.draw(st.lists(st.sampled_from([0, 1, 5, 100, 400]), min_size=rows, max_size=rows)))
    top_p = torch.tensor(data.draw(st.lists(st.sampled_from([0.05, 0.5, 0.9, 0.99, 1.0]), min_size=rows,
                                            max_size=rows)))
    limit = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    fast, full = filter_top_k_top_p(logits, top_k, top_p), _filter_sorted(logits, limit, top_p)
    kept_fast, kept_full = torch.isfinite(fast), torch.isfinite(full)
    # the same tokens kept, except where a token sits exactly on the nucleus boundary (rounding of the mass)
    assert (kept_fast != kept_full).sum() <= rows
    assert torch.equal(fast[kept_fast & kept_full], logits[kept_fast & kept_full])


def test_draws_stay_inside_the_nucleus_and_follow_the_distribution() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 3000, generator=g) * 4
    params = [SamplingParams(temperature=1.0, top_p=0.3, seed=i) for i in range(4)]
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    allowed = torch.isfinite(filter_top_k_top_p(logits, torch.zeros(4, dtype=torch.long), torch.full((4,), 0.3)))
    counts = torch.zeros(4, 3000)
    for _ in range(400):
        tokens, _, _ = sample_next(logits, params, gens)
        assert bool(allowed[torch.arange(4), tokens].all())
        counts[torch.arange(4), tokens] += 1
    # the most likely token is drawn about as often as its renormalised probability says
    probs = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
    top = probs.argmax(-1)
    freq = counts[torch.arange(4), top] / 400
    assert torch.allclose(freq, probs[torch.arange(4), top], atol=0.1)
