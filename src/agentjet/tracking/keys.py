"""Canonical keys of messages and tool lists, and digests of message prefixes (for equality tests and caches)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any


def _canonical_arguments(args: Any) -> Any:
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


# the fields that make a message what it is; others (refusal, audio, annotations, ...) are client noise
MESSAGE_FIELDS = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")


def message_key(message: dict[str, Any]) -> str:
    """A canonical text form of a message for equality tests: only ``MESSAGE_FIELDS``, None values dropped (as the
    chat template call does), tool-call ids dropped, tool-call arguments parsed. Used to find which earlier call
    generated an assistant message and for the TEXT compare level; it never decides alone which tokens go into
    a sample (the rendered text and the token ids are checked as well)."""
    out: dict[str, Any] = {}
    for k, v in message.items():
        if v is None or k not in MESSAGE_FIELDS:
            continue
        if k == "tool_calls":
            if not v:
                continue
            calls = []
            for tc in v:
                f = tc.get("function", tc) if isinstance(tc, dict) else {}
                calls.append({"name": f.get("name"), "arguments": _canonical_arguments(f.get("arguments"))})
            out[k] = calls
        elif k == "content" and isinstance(v, list):
            out[k] = "".join(p.get("text", "") for p in v if isinstance(p, dict))
        else:
            out[k] = v
    if out.get("content") is None:
        out["content"] = ""
    return json.dumps(out, sort_keys=True, ensure_ascii=False, default=str)


def tools_key(tools: list[dict[str, Any]] | None) -> str:
    return json.dumps(tools or [], sort_keys=True, ensure_ascii=False, default=str)


def prefix_digests(keys: Sequence[str]) -> list[str]:
    """``d[k]`` identifies ``keys[:k]`` (rolling SHA-1), ``len(d) == len(keys) + 1``."""
    h = hashlib.sha1(b"agentjet-messages")
    out = [h.hexdigest()]
    for k in keys:
        h.update(b"\x00" + k.encode())
        out.append(h.copy().hexdigest())
    return out


__all__ = ["MESSAGE_FIELDS", "message_key", "prefix_digests", "tools_key"]
