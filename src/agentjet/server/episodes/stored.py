"""Stored calls: the Responses API's ``store`` and ``previous_response_id``. A stored call keeps its own input
messages and the reply it gave, with its episode and for the episode's life (``EpisodeRegistry.close`` drops
them), so that a later call of the same episode that names it continues that conversation with only its new
items. Instructions are not carried over (the Responses API's rule): each call gives its own. An id that this
episode never stored (another episode's, a call made with ``store: false``, a typo) is a 404."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentjet.server.errors import bad_request, not_found


@dataclass(frozen=True)
class StoredCall:
    previous: str | None  # the stored call this one continued, if any
    messages: list[dict[str, Any]]  # its own input, normalised (instructions not included)
    reply: dict[str, Any]  # the assistant message it answered, normalised


def stored_history(stored: dict[str, StoredCall], response_id: str, limit: int) -> list[dict[str, Any]]:
    """The conversation up to and including the stored call ``response_id``: every earlier stored call's input
    and reply, oldest first. At most ``limit`` messages (a 400 naming ``previous_response_id`` beyond)."""
    chain: list[StoredCall] = []
    size = 0
    rid: str | None = response_id
    while rid is not None:
        call = stored.get(rid)
        if call is None:
            raise not_found(f"previous_response_id {rid!r} is not a stored response of this episode (a response is "
                            "stored with its episode, for the episode's life, when it was made with store: true)")
        chain.append(call)
        size += len(call.messages) + 1
        if size > limit:
            raise bad_request(f"the conversation behind previous_response_id has more than {limit} messages",
                              param="previous_response_id")
        rid = call.previous
    history: list[dict[str, Any]] = []
    for call in reversed(chain):
        history += call.messages
        history.append(call.reply)
    return history
