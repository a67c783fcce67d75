"""The learner side of the Tinker training API (issue 35; ``docs/tinker.md``): ``forward``, ``forward_backward`` and
``optim_step`` on one named LoRA adapter of an ``InProcessLearner``, with Tinker's semantics.

- A datum is ``tokens`` (the model input, N tokens) with per-position ``target_tokens`` (N: the token predicted
  at each position), and for the losses ``weights`` (cross_entropy), ``logprobs`` (the sampler's) and
  ``advantages`` (importance_sampling, ppo), each N long.
- Losses are sums over tokens, never means: ``cross_entropy`` = -sum w*lp; ``importance_sampling`` =
  -sum exp(lp - q)*A; ``ppo`` = -sum min(r*A, clip(r, low, high)*A) with ``clip_low_threshold`` /
  ``clip_high_threshold`` (defaults 0.8 / 1.2) from ``loss_fn_config``.
- ``forward_backward`` adds to the adapter's gradients; ``optim_step`` applies one AdamW step with the caller's
  Adam parameters (learning rate, betas, eps, weight decay, gradient clip; 0 = no clip) and clears them.
- Everything runs on the learner's worker thread (the generator's: between decode steps), in eval mode (no
  dropout: ``forward`` equals ``sample``'s logprobs on the same tokens)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from agentjet.engines.logprobs import chunked_token_logprobs
from agentjet.engines.model import adapter_has_unembed, output_weight
from agentjet.files import atomic_file
from agentjet.learners.inprocess import InProcessLearner

LOSSES = ("cross_entropy", "importance_sampling", "ppo")


@dataclass
class TinkerDatum:
    tokens: list[int]
    target_tokens: list[int]
    weights: list[float] | None = None
    logprobs: list[float] | None = None  # the sampler's, for importance_sampling / ppo
    advantages: list[float] | None = None

    def check(self, loss_fn: str, vocab: int) -> None:
        n = len(self.tokens)
        if n == 0:
            raise ValueError("a datum needs at least one input token")
        if len(self.target_tokens) != n:
            raise ValueError(f"target_tokens has {len(self.target_tokens)} entries for {n} input tokens")
        for name in ("weights", "logprobs", "advantages"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(f"{name} has {len(v)} entries for {n} input tokens")
            if v is not None and not all(math.isfinite(x) for x in v):
                raise ValueError(f"{name} holds a non-finite value")
        if any(not 0 <= t < vocab for t in (*self.tokens, *self.target_tokens)):
            raise ValueError(f"a token id is outside the vocabulary (0..{vocab - 1})")
        if loss_fn in ("importance_sampling", "ppo") and (self.logprobs is None or self.advantages is None):
            raise ValueError(f"{loss_fn} needs logprobs and advantages in loss_fn_inputs")


@dataclass
class FwdBwdResult:
    logprobs: list[list[float]]
    elementwise_loss: list[list[float]]
    loss_sum: float


def check_batch(data: Sequence[TinkerDatum], loss_fn: str, vocab: int) -> None:
    if loss_fn not in LOSSES:
        raise ValueError(f"loss_fn {loss_fn!r} is not supported here: use one of {', '.join(LOSSES)}")
    if not data:
        raise ValueError("forward_backward needs at least one datum")
    for d in data:
        d.check(loss_fn, vocab)


def _loss(loss_fn: str, lp: torch.Tensor, d: TinkerDatum, config: dict[str, float]) -> torch.Tensor:
    dev = lp.device
    if loss_fn == "cross_entropy":
        w = torch.tensor(d.weights, device=dev) if d.weights is not None else torch.ones_like(lp)
        return -(w * lp)
    q = torch.tensor(d.logprobs, device=dev)
    adv = torch.tensor(d.advantages, device=dev)
    ratio = torch.exp(lp - q)
    if loss_fn == "importance_sampling":
        return -(ratio * adv)
    low, high = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)
    return -torch.minimum(ratio * adv, torch.clamp(ratio, low, high) * adv)


def _micro_batches(data: Sequence[TinkerDatum], max_tokens: int) -> list[list[int]]:
    groups: list[list[int]] = [[]]
    width = 0
    for i, d in enumerate(data):
        w = max(width, len(d.tokens))
        if groups[-1] and w * (len(groups[-1]) + 1) > max_tokens:
            groups.append([])
            w = len(d.tokens)
        groups[-1].append(i)
        width = w
    return groups


def _graded(d: TinkerDatum, loss_fn: str) -> list[bool]:
    """The target positions whose loss term can have a gradient: a non-zero weight (cross-entropy; no weights:
    all) or a non-zero advantage (the policy losses). Elsewhere the term is 0 whatever the logprob."""
    values = d.weights if loss_fn == "cross_entropy" else d.advantages
    return [True] * len(d.target_tokens) if values is None else [v != 0 for v in values]


def _logprobs(learner: InProcessLearner, data: list[TinkerDatum],
              graded: list[list[bool]] | None = None) -> list[torch.Tensor]:
    """Each datum's logprobs of its target tokens (with the graph when grad is enabled). With ``graded``, only
    those positions keep the graph: the others (a prompt's, say) are computed without it, which saves their share
    of the vocabulary projection's backward, the larger part of a step on a small model."""
    policy = learner.policy
    width = max(len(d.tokens) for d in data)
    ids = torch.full((len(data), width), policy.pad_id, dtype=torch.long)
    attn = torch.zeros((len(data), width), dtype=torch.long)
    targets = torch.zeros((len(data), width), dtype=torch.long)
    for i, d in enumerate(data):
        n = len(d.tokens)
        ids[i, :n] = torch.tensor(d.tokens)
        attn[i, :n] = 1
        targets[i, :n] = torch.tensor(d.target_tokens)
    ids, attn, targets = ids.to(policy.device), attn.to(policy.device), targets.to(policy.device)
    lm = policy.causal_lm
    hidden = lm.base_model(input_ids=ids, attention_mask=attn).last_hidden_state
    mask = attn.bool()
    h, t, weight, chunk = hidden[mask], targets[mask], output_weight(lm), learner.config.logprob_chunk_tokens
    ones = torch.ones(h.shape[0], device=policy.device)
    if graded is None or not torch.is_grad_enabled():
        flat = chunked_token_logprobs(h, weight, t, ones, chunk)
    else:
        g = torch.tensor([x for row in graded for x in row], dtype=torch.bool, device=policy.device)
        flat = torch.zeros(h.shape[0], dtype=torch.float32, device=policy.device)
        with torch.no_grad():
            flat[~g] = chunked_token_logprobs(h[~g], weight, t[~g], ones[~g], chunk)
        flat[g] = chunked_token_logprobs(h[g], weight, t[g], ones[g], chunk)
    return list(torch.split(flat, [len(d.tokens) for d in data]))


def forward_backward(learner: InProcessLearner, data: list[TinkerDatum], loss_fn: str,
                     config: dict[str, float], backward: bool = True) -> FwdBwdResult:
    """On the worker thread: the losses of ``data`` on the learner's adapter; with ``backward`` their
    gradients are added to the adapter's (until ``optim_step``)."""
    learner.activate()
    learner.policy.model.eval()
    out_lp: list[list[float]] = [[] for _ in data]
    out_loss: list[list[float]] = [[] for _ in data]
    total = 0.0
    for group in _micro_batches(data, learner.micro_batch_tokens):
        part = [data[i] for i in group]
        with torch.set_grad_enabled(backward):
            lps = _logprobs(learner, part, [_graded(d, loss_fn) for d in part])
            losses = [_loss(loss_fn, lp.float(), d, config) for lp, d in zip(lps, part, strict=True)]
            loss = torch.stack([x.sum() for x in losses]).sum()
            if backward:
                loss.backward()
        total += float(loss.detach())
        for i, lp, el in zip(group, lps, losses, strict=True):
            out_lp[i] = lp.detach().float().tolist()
            out_loss[i] = el.detach().float().tolist()
    return FwdBwdResult(out_lp, out_loss, total)


def optim_step(learner: InProcessLearner, adam: dict[str, Any]) -> dict[str, float]:
    """On the worker thread: one AdamW step of the adapter with these parameters, then its gradients cleared."""
    learner.activate()
    lr = float(adam.get("learning_rate", 1e-4))
    betas = (float(adam.get("beta1", 0.9)), float(adam.get("beta2", 0.95)))
    eps = float(adam.get("eps", 1e-12))
    wd = float(adam.get("weight_decay", 0.0))
    clip = float(adam.get("grad_clip_norm", 0.0))
    if not (lr >= 0 and 0 <= betas[0] < 1 and 0 <= betas[1] < 1 and eps > 0 and wd >= 0
            and all(math.isfinite(x) for x in (lr, eps, wd, clip))):
        raise ValueError(f"bad Adam parameters: {adam}")
    config = replace(learner.config, learning_rate=lr, betas=betas, weight_decay=wd,
                     max_grad_norm=clip if clip > 0 else math.inf)
    optimizer = learner.optimizer
    for group in optimizer.optimizer.param_groups:
        group["eps"] = eps
    if not any(p.grad is not None for p in optimizer.params):
        return {"grad_norm:mean": 0.0}
    grad_norm = optimizer.step(config)
    learner.policy_version += 1
    return {"grad_norm:mean": grad_norm if math.isfinite(grad_norm) else 0.0}


def copy_adapter(learner: InProcessLearner, source: str, target: str) -> None:
    """On the worker thread: adapter ``target``'s LoRA weights := ``source``'s (a sampler's snapshot)."""
    from agentjet.engines.model import adapter_parameters

    model = learner.policy.model
    src, dst = adapter_parameters(model, source), adapter_parameters(model, target)
    if [p.shape for p in src] != [p.shape for p in dst]:
        raise ValueError(f"adapters {source!r} and {target!r} differ in shape: cannot copy")
    with torch.no_grad():
        for s, d in zip(src, dst, strict=True):
            d.copy_(s)


@torch.no_grad()
def prompt_logprobs(learner: InProcessLearner, tokens: list[int]) -> list[float]:
    """On the worker thread: log p(tokens[i] | tokens[:i]) for i >= 1 on the learner's adapter (len - 1 values)."""
    learner.activate()
    learner.policy.model.eval()
    if len(tokens) < 2:
        return []
    (lp,) = _logprobs(learner, [TinkerDatum(tokens=tokens[:-1], target_tokens=tokens[1:])])
    return lp.float().tolist()


def save_adapter_state(learner: InProcessLearner, path: Path) -> None:
    """On the worker thread: the adapter's LoRA weights and (after a step) its optimizer state, to ``path``."""
    state = {"params": [p.detach().cpu().clone() for p in learner.params],
             "optimizer": learner.optimizer.state_dict() if learner.has_optimizer else None,
             "version": learner.policy_version,
             "unembed": learner.adapter is not None and adapter_has_unembed(learner.policy.model, learner.adapter)}
    with atomic_file(path) as tmp:  # the one atomic writer: a crash never leaves a torn state file
        torch.save(state, tmp)


def checkpoint_shape(path: Path) -> tuple[int, bool]:
    """The LoRA rank of a saved state (``save_adapter_state``: its first LoRA tensor's smaller side, A being r x in
    and B out x r), and whether it has LoRA on the output layer (train_unembed; states saved before that: no)."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    params = state["params"]
    if not params:
        raise ValueError(f"the checkpoint {path.name} holds no LoRA weights")
    return int(min(params[0].shape)), bool(state.get("unembed", False))


def load_adapter_state(learner: InProcessLearner, path: Path, optimizer: bool) -> None:
    """On the worker thread: the adapter's weights (and with ``optimizer`` its optimizer state) from ``path``."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    params = state["params"]
    if [p.shape for p in params] != [p.shape for p in learner.params]:
        raise ValueError(f"the checkpoint's LoRA shapes do not fit this training client (another rank, base or "
                         f"train_unembed?): "
                         f"{len(params)} tensors")
    with torch.no_grad():
        for p, saved in zip(learner.params, params, strict=True):
            p.copy_(saved.to(p.device, p.dtype))
    if optimizer and state.get("optimizer") is not None:
        learner.optimizer.load_state_dict(state["optimizer"])
    elif learner.has_optimizer:
        learner.optimizer.sync_masters()
