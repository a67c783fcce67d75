"""Token-in, token-out at request time.

An agent sends the model's earlier replies back as text. Re-tokenizing that text can give other ids than the
ones the model generated (drift), so the model would condition on tokens it never produced, and its behaviour
logprobs would belong to a context the training sample does not hold. When a request resends assistant
messages that this agent generated earlier in the same episode, the server builds the prompt with the exact
generated ids spliced in (``agentjet.tracking.drift.tito_prompt_ids``). The recorded prompt then already holds
the generated ids, and the tracker finds no drift to repair at episode end.

Safety: the spliced prompt is used only when it decodes to exactly the text of the plain prompt; anything
unexpected falls back to the plain prompt (and is counted), never to an error.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from agentjet.server.episodes.chat import ChatFormatter
from agentjet.tracking import CallRecord
from agentjet.tracking.drift import TitoOutcome, TitoSession, decode_exact, tito_prompt_ids

log = logging.getLogger(__name__)


def may_splice(calls: Sequence[CallRecord], agent: str, messages: list[dict[str, Any]]) -> bool:
    """Cheap pre-check: the request resends an assistant message and this agent generated something before."""
    return any(m.get("role") == "assistant" for m in messages) and any(c.agent == agent for c in calls)


def request_prompt_ids(
    formatter: ChatFormatter,
    plain_ids: list[int],
    calls: Sequence[CallRecord],
    agent: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    session: TitoSession | None = None,
) -> tuple[list[int], TitoOutcome, int]:
    """The prompt to feed the engine: ``plain_ids`` (the template applied and tokenized) with the earlier
    generations of ``agent`` put back as generated, when that changes anything. Returns the ids, the outcome
    and the number of re-tokenizations it prevented. Safe to run in a worker thread (``session``, the episode's
    state carried between its requests, has a lock). It renders and tokenizes the conversation a few times, so
    callers on a hot path check ``may_splice`` first (the server does, before handing this to a thread).
    Without ``session`` it re-renders every prefix of the conversation and re-indexes every earlier call: a
    cost that grows with the square of the turns."""
    try:
        r_messages, r_tools = formatter.as_rendered(messages, tools)
        ids, rep = tito_prompt_ids(formatter.tokenizer, r_messages, r_tools, agent, calls, session=session)
    except Exception as exc:  # a template quirk must never fail the request
        log.debug("token-in/token-out splice failed: %r", exc)
        return plain_ids, TitoOutcome.FALLBACK, 0
    if rep.error is not None or rep.drift_repaired == 0 or ids == plain_ids:
        return plain_ids, TitoOutcome.PLAIN, 0
    tok = formatter.tokenizer
    if decode_exact(tok, ids) != decode_exact(tok, plain_ids):
        log.debug("token-in/token-out splice changed the prompt text; using the plain prompt")
        return plain_ids, TitoOutcome.FALLBACK, 0
    return ids, TitoOutcome.SPLICED, rep.drift_repaired


__all__ = ["TitoOutcome", "TitoSession", "may_splice", "request_prompt_ids"]
