"""A JSON-ready view of one training sample, for the server's episode trace endpoint and for debugging."""

from __future__ import annotations

from typing import Any

from agentjet.tracking.types import NO_VERSION, EpisodeSample


def version_changes(versions: list[int], owner: list[int | None] | None = None) -> list[dict[str, int]]:
    """Where the policy version changes between two consecutive generated tokens of one reply (a weight
    update landed while it was generated): ``{"index", "from", "to"}``, ``index`` being the first token at the
    new version. A change across a prompt or tool token, or between two calls (``owner``: each token's call),
    is not listed."""
    out = []
    for i in range(1, len(versions)):
        a, b = versions[i - 1], versions[i]
        same_call = owner is None or owner[i - 1] == owner[i]
        if a != NO_VERSION and b != NO_VERSION and a != b and same_call:
            out.append({"index": i, "from": a, "to": b})
    return out


def sample_trace(sample: EpisodeSample, tokenizer: Any = None) -> dict[str, Any]:
    """Token-level trace of a sample: ids, text pieces (one per token; they concatenate to the decoded text
    except where a character spans several byte-level tokens), loss mask, behaviour logprobs, the owning call
    of each trained token, call boundaries, message spans, drift regions and the merge / drift statistics."""
    ids = list(sample.input_ids)
    if tokenizer is not None:
        pieces = [tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]
    else:
        pieces = [str(i) for i in ids]
    versions = sample.versions
    spans = list(sample.stats.get("call_spans", []))
    owner: list[int | None] = [None] * len(ids)
    for sp in spans:
        for t in range(sp["gen_start"], min(sp["gen_end"], len(ids))):
            owner[t] = sp["call_index"]
    calls = []
    for sp in spans:
        calls.append({
            "call_index": sp["call_index"],
            "prompt": [0, sp["gen_start"]],  # the context this call saw is a prefix of the sample
            "generated": [sp["gen_start"], sp["gen_end"]],
            "exact_context": sp.get("exact_context", True),
            "prompt_repaired": sp.get("prompt_repaired", False),
            "policy_version": sp.get("policy_version"),
            "finish_reason": sp.get("finish_reason"),
            "api": sp.get("api", "chat.completions"),  # samples stored before the API was recorded came through chat
        })
    stats = {k: v for k, v in sample.stats.items() if k not in ("call_spans", "messages", "drift_regions")}
    return {
        "agent": sample.agent,
        "temperature": sample.temperature,
        "call_indices": list(sample.call_indices),
        "min_policy_version": sample.min_policy_version,
        "weight": sample.weight,
        "num_tokens": len(ids),
        "num_trained_tokens": int(sum(sample.loss_mask)),
        "token_ids": ids,
        "pieces": pieces,
        "loss_mask": list(sample.loss_mask),
        "logprobs": [float(x) for x in sample.behaviour_logprobs],
        "versions": [v if v != NO_VERSION else None for v in versions],  # per token: the policy that generated it
        "version_changes": version_changes(versions, owner),
        "token_call": owner,
        "calls": calls,
        "messages": list(sample.stats.get("messages", [])),
        "generation_prompt": sample.stats.get("generation_prompt"),
        "drift_regions": list(sample.stats.get("drift_regions", [])),  # repaired / kept re-tokenization drift
        "stats": stats,
    }


__all__ = ["sample_trace", "version_changes"]
