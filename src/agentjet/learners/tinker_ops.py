"""The learner side of the Tinker training API (issue 35; ``docs/tinker.md``): ``forward``, ``forward_backward`` and
``optim_step`` on one named LoRA adapter of an ``InProcessLearner``, with Tinker's semantics.

- A datum is ``tokens`` (the model input, N tokens) with per-position ``target_tokens`` (N: the token predicted
  at each position), and for the losses ``weights`` (cross_entropy), ``logprobs`` (the sampler's, ``q``) and
  ``advantages`` (``A``; every other loss), each N long.
- Losses are sums over tokens, never means, with ``r = exp(lp - q)`` (``LOSSES``; docs/tinker.md has each
  formula with its reference): ``cross_entropy`` = -sum w*lp; ``importance_sampling`` = -sum r*A; ``ppo`` =
  -sum min(r*A, clip(r, low, high)*A); ``cispo`` = -sum sg(clip(r, low, high))*A*lp; ``dro`` =
  -sum (lp*A - beta/2 * (lp - q)^2); ``gspo`` = ppo's terms with one ratio per datum, the geometric mean of r over
  its positions with a non-zero advantage; ``stable_reinforce`` = -sum sg(r)*A*lp. The thresholds and ``beta``
  come from ``loss_fn_config`` (``LOSS_CONFIG``: the defaults).
- A micro-batch in which no position can carry a gradient (every weight or advantage 0) adds no gradient: its
  loss is computed and reported (0 where it is 0) and ``backward`` is not run.
- ``forward_backward`` adds to the adapter's gradients; ``optim_step`` applies one AdamW step with the caller's
  Adam parameters (learning rate, betas, eps, weight decay, gradient clip; 0 = no clip) and clears them.
- Everything runs on the learner's worker thread (the generator's: between decode steps), in eval mode (no
  dropout: ``forward`` equals ``sample``'s logprobs on the same tokens)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from agentjet.algorithms.loss import cispo_terms, dro_terms, importance_log_ratio, ppo_clip_terms
from agentjet.algorithms.objectives import RatioLevel
from agentjet.engines.logprobs import chunked_token_logprobs
from agentjet.engines.model import adapter_has_unembed, output_weight
from agentjet.files import atomic_file
from agentjet.learners.inprocess import InProcessLearner

# The SDK's loss names (tinker 0.38.0's LossFnType, less "custom": a client-side loss) and, for each, the
# loss_fn_config keys it reads with their defaults (the Tinker docs' where they give one; docs/tinker.md, "Losses").
LOSS_CONFIG: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
    "dro": {"beta": 0.05},
    "gspo": {"clip_low_threshold": 1.0 - 3e-4, "clip_high_threshold": 1.0 + 4e-4},
    "stable_reinforce": {"clip_low_threshold": 0.0, "clip_high_threshold": math.inf},
}
LOSSES = tuple(LOSS_CONFIG)
POLICY_LOSSES = tuple(x for x in LOSSES if x != "cross_entropy")  # they need logprobs and advantages


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
        if loss_fn in POLICY_LOSSES and (self.logprobs is None or self.advantages is None):
            raise ValueError(f"{loss_fn} needs logprobs and advantages in loss_fn_inputs")


@dataclass
class FwdBwdResult:
    logprobs: list[list[float]]
    elementwise_loss: list[list[float]]
    loss_sum: float


def loss_config(loss_fn: str, config: dict[str, float]) -> dict[str, float]:
    """``loss_fn``'s settings: its defaults (``LOSS_CONFIG``) with the caller's values; other keys are ignored."""
    if loss_fn not in LOSS_CONFIG:
        raise ValueError(f"loss_fn {loss_fn!r} is not supported here: use one of {', '.join(LOSSES)}")
    out = {k: float(config.get(k, v)) for k, v in LOSS_CONFIG[loss_fn].items()}
    if any(math.isnan(v) for v in out.values()):
        raise ValueError(f"loss_fn_config for {loss_fn} holds NaN: {out}")
    if "clip_low_threshold" in out and not 0 <= out["clip_low_threshold"] <= out["clip_high_threshold"]:
        raise ValueError(f"{loss_fn} needs 0 <= clip_low_threshold <= clip_high_threshold (got {out})")
    if out.get("beta", 0.0) < 0 or math.isinf(out.get("beta", 0.0)):
        raise ValueError(f"dro needs a finite beta >= 0 (got {out['beta']})")
    return out


def check_batch(data: Sequence[TinkerDatum], loss_fn: str, vocab: int, config: dict[str, float] | None = None) -> None:
    loss_config(loss_fn, config or {})
    if not data:
        raise ValueError("forward_backward needs at least one datum")
    for d in data:
        d.check(loss_fn, vocab)


def _loss(loss_fn: str, lp: torch.Tensor, d: TinkerDatum, config: dict[str, float]) -> torch.Tensor:
    """Per position, the loss term of ``loss_fn`` (its settings: ``loss_config``), with the policy-gradient
    objectives of ``algorithms/loss.py`` (their clip ``[1 - eps_low, 1 + eps_high]`` is Tinker's ``[low, high]``)."""
    dev = lp.device
    if loss_fn == "cross_entropy":
        w = torch.tensor(d.weights, device=dev) if d.weights is not None else torch.ones_like(lp)
        return -(w * lp)
    q = torch.tensor(d.logprobs, device=dev)
    adv = torch.tensor(d.advantages, device=dev)
    if loss_fn == "dro":
        return dro_terms(lp, q, adv, config["beta"])
    if loss_fn == "importance_sampling":
        return -(torch.exp(lp - q) * adv)
    eps_low, eps_high = 1.0 - config["clip_low_threshold"], config["clip_high_threshold"] - 1.0
    if loss_fn == "gspo":
        return _gspo(lp, q, adv, eps_low, eps_high)
    ratio = torch.exp(lp - q)
    if loss_fn == "ppo":
        return ppo_clip_terms(ratio, adv, eps_low, eps_high)[0]
    return cispo_terms(ratio, lp, adv, eps_low, eps_high)[0]  # cispo, stable_reinforce (no clip by default)


def _gspo(lp: torch.Tensor, q: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """GSPO on one datum: the sequence is its positions with a non-zero advantage (a prompt's have none); one
    ratio for them all, ``exp(mean(lp - q))``, in PPO's clipped terms; 0 elsewhere."""
    seq = adv != 0
    out = torch.zeros_like(lp)
    if bool(seq.any()):
        one = torch.zeros(int(seq.sum()), dtype=torch.long, device=lp.device)
        ratio = torch.exp(importance_log_ratio(lp[seq], q[seq], one, RatioLevel.SEQUENCE))
        out[seq] = ppo_clip_terms(ratio, adv[seq], eps_low, eps_high)[0]
    return out


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


def _graded(d: TinkerDatum, loss_fn: str, config: dict[str, float] | None = None) -> list[bool]:
    """The target positions whose loss term can have a gradient: a non-zero weight (cross-entropy; no weights:
    all) or a non-zero advantage (the policy losses). Elsewhere the term is 0 whatever the logprob. DRO's
    quadratic term has a gradient wherever lp differs from q, so with a ``beta`` above 0 all of its positions are
    graded."""
    if loss_fn == "dro" and (config or {}).get("beta", LOSS_CONFIG["dro"]["beta"]) > 0:
        return [True] * len(d.target_tokens)
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
    settings = loss_config(loss_fn, config)
    out_lp: list[list[float]] = [[] for _ in data]
    out_loss: list[list[float]] = [[] for _ in data]
    total = 0.0
    for group in _micro_batches(data, learner.micro_batch_tokens):
        part = [data[i] for i in group]
        graded = [_graded(d, loss_fn, settings) for d in part]
        with torch.set_grad_enabled(backward):
            lps = _logprobs(learner, part, graded)
            losses = [_loss(loss_fn, lp.float(), d, settings) for lp, d in zip(lps, part, strict=True)]
            loss = torch.stack([x.sum() for x in losses]).sum()
            # no position with a gradient (a micro-batch of constant-reward groups, all weights 0): nothing to add,
            # and the loss has no graph to run backward through
            if backward and any(any(g) for g in graded) and loss.requires_grad:
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


@torch.no_grad()
def prompt_topk(learner: InProcessLearner, tokens: list[int], k: int, rows: int = 256) -> list[list[tuple[int, float]]]:
    """On the worker thread: for each i >= 1, the ``k`` likeliest tokens at position i of ``tokens`` given
    ``tokens[:i]`` and their logprobs, on the learner's adapter (len - 1 lists; ``topk_prompt_logprobs``). The full
    vocabulary's logits exist for ``rows`` positions at a time."""
    learner.activate()
    learner.policy.model.eval()
    if len(tokens) < 2 or k < 1:
        return []
    policy = learner.policy
    ids = torch.tensor([tokens[:-1]], dtype=torch.long, device=policy.device)
    hidden = policy.causal_lm.base_model(input_ids=ids).last_hidden_state[0]
    weight = output_weight(policy.causal_lm)
    out: list[list[tuple[int, float]]] = []
    for start in range(0, hidden.shape[0], rows):
        logp = torch.log_softmax((hidden[start:start + rows] @ weight.T).float(), dim=-1)
        top = torch.topk(logp, min(k, logp.shape[-1]), dim=-1)
        out.extend([(int(t), float(v)) for t, v in zip(ti, vi, strict=True)]
                   for ti, vi in zip(top.indices.tolist(), top.values.tolist(), strict=True))
    return out


def export_adapter(learner: InProcessLearner, directory: Path) -> None:
    """On the worker thread: the adapter alone as a standard PEFT adapter in ``directory`` (``adapter_config.json``,
    ``adapter_model.safetensors``: what ``PeftModel.from_pretrained`` loads on the served base). The LoRA tensors
    alone: not the base's embedding matrix, which PEFT would add for LoRA on a tied output layer (113 MB on SmolLM2)."""
    from agentjet.weights.io import write_adapter_files

    learner.activate()
    if learner.adapter is None:
        raise ValueError("this learner has no named adapter to export")
    write_adapter_files(learner.policy.model, learner.adapter, directory, embeddings=False)
    config_file = Path(directory) / "adapter_config.json"  # the base it applies to: the served model's directory
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = str(learner.policy.path)
    config_file.write_text(json.dumps(config, indent=2))


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
