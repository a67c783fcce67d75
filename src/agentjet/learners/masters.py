"""fp32 master weights in one flat buffer (``learner.flat_masters``), for :class:`~agentjet.learners.policy_step.
PolicyOptimizer`.

With bf16 or fp16 weights the optimizer steps fp32 masters and copies them back into the weights. By default each
weight has a master of its own, and AdamW, the gradient clipping and the grad cast walk a list of hundreds of
tensors every step (272 at SmolLM2-135M's shapes), each walk a Python loop and a group of kernel launches. Here the
masters are views into ONE fp32 buffer, and each step's fp32 gradient is one buffer too: AdamW and the clipping
see a single tensor. The weights themselves do not move (a generator's CUDA graphs hold their addresses).

The update is AdamW's, element by element, so it equals the default's but for the gradient norm, which is summed in
another order (the clip factor can differ in its last bits: equal within fp32 rounding,
tests/learners/test_train_step_options.py). Two conditions keep it so: every trained weight gets a gradient in every step
(AdamW skips a weight without one; a flat buffer cannot, so a step without one is refused), and the weights are
plain tensors (a trainer group's DTensors keep the default). Checkpoints are written in the default's per-weight
layout, so either setting reads the other's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class FlatMasters:
    """The masters of ``params`` as views into one fp32 buffer (``flat``), filled from the weights."""

    def __init__(self, params: Sequence[torch.nn.Parameter]) -> None:
        self.params = list(params)
        self.numels = [p.numel() for p in self.params]
        self.flat = torch.empty(sum(self.numels), dtype=torch.float32, device=self.params[0].device)
        self.views = self.split(self.flat)
        with torch.no_grad():
            torch._foreach_copy_(self.views, [p.detach() for p in self.params])

    def split(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        """``buffer`` (one value per element of the weights) as one view per weight, shaped like it."""
        return [v.view_as(p) for v, p in zip(buffer.split(self.numels), self.params, strict=True)]

    def take_grads(self) -> None:
        """The weights' low-precision grads, cast into one new fp32 buffer, become the flat master's grad; the
        weights' own are dropped."""
        missing = [i for i, p in enumerate(self.params) if p.grad is None]
        if missing:
            raise ValueError(f"learner.flat_masters: {len(missing)} trained weight(s) got no gradient this step "
                             f"(the first: parameter #{missing[0]}, shape {tuple(self.params[missing[0]].shape)}); "
                             "a flat buffer would step them anyway: turn flat_masters off for this model")
        grad = torch.empty_like(self.flat)
        torch._foreach_copy_(self.split(grad), [p.grad for p in self.params if p.grad is not None])
        self.flat.grad = grad
        for p in self.params:
            p.grad = None

    def per_weight_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """AdamW's state of the one flat tensor as the per-weight state the default optimizer writes: the moments
        as views (no copy: ``torch.save`` writes their buffer once), the step count copied for each weight (an
        optimizer that loads it increments each weight's own)."""
        n = len(self.params)
        groups = [{**g, "params": list(range(n))} for g in state["param_groups"]]
        flat_state = state["state"].get(0)
        per: dict[int, dict[str, Any]] = {i: {} for i in range(n)} if flat_state else {}
        for key, value in (flat_state or {}).items():
            parts = self.split(value) if self._is_flat(value) else [
                value.clone() if isinstance(value, torch.Tensor) else value for _ in range(n)]
            for i in range(n):
                per[i][key] = parts[i]
        return {"state": per, "param_groups": groups}

    def flat_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A per-weight AdamW state (the default's, or :meth:`per_weight_state`'s) for the one flat tensor."""
        groups = [{**g, "params": [0]} for g in state["param_groups"]]
        per = state["state"]
        if not per:
            return {"state": {}, "param_groups": groups}
        n = len(self.params)
        if sorted(per) != list(range(n)):
            raise ValueError(f"learner.flat_masters: the optimizer state holds {len(per)} of {n} weights (a "
                             "weight that never stepped); load it with flat_masters off")
        out: dict[str, Any] = {}
        for key, first in per[0].items():
            values = [per[i][key] for i in range(n)]
            if isinstance(first, torch.Tensor) and first.dim() > 0:
                out[key] = torch.cat([v.reshape(-1).to(self.flat.device) for v in values])
            elif all(torch.equal(torch.as_tensor(v), torch.as_tensor(first)) for v in values):
                out[key] = first  # the step count: one for every weight
            else:
                raise ValueError(f"learner.flat_masters: the weights' optimizer {key!r} differ (some weights "
                                 "stepped fewer times); load this state with flat_masters off")
        return {"state": {0: out}, "param_groups": groups}

    def _is_flat(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == self.flat.numel()
