"""The chunked token-logprob function against plain autograd: values and gradients (it has a hand-written
backward)."""

from __future__ import annotations

import pytest
import torch

from agentjet.engines.logprobs import chunked_token_logprobs


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_values_and_gradients_match_full_logits(chunk: int) -> None:
    torch.manual_seed(0)
    n, h, v = 11, 16, 50
    hidden = torch.randn(n, h, requires_grad=True)
    weight = torch.randn(v, h, requires_grad=True)
    targets = torch.randint(0, v, (n,))
    temps = torch.rand(n) + 0.5
    upstream = torch.randn(n)

    ours = chunked_token_logprobs(hidden, weight, targets, temps, chunk)
    (ours * upstream).sum().backward()
    g_hidden, g_weight = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    ref = ((hidden @ weight.t()) / temps[:, None]).log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    (ref * upstream).sum().backward()
    assert torch.allclose(ours, ref, atol=1e-5)
    assert torch.allclose(g_hidden, hidden.grad, atol=1e-5)
    assert torch.allclose(g_weight, weight.grad, atol=1e-5)


def test_no_grad_path_and_empty_input() -> None:
    hidden, weight = torch.randn(4, 8), torch.randn(10, 8)
    with torch.no_grad():
        out = chunked_token_logprobs(hidden, weight, torch.tensor([1, 2, 3, 4]), torch.ones(4), 2)
    assert out.shape == (4,) and bool((out <= 0).all())
    empty = chunked_token_logprobs(torch.zeros(0, 8), weight, torch.zeros(0, dtype=torch.long), torch.ones(0), 2)
    assert empty.shape == (0,)
