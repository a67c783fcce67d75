"""The reverse-text taskset's data and scorer, in plain Python (no verifiers import), so that anything can
rescore a reply: the taskset's reward calls ``score``, and AgentJet's test recomputes it from the text the
server recorded."""

from __future__ import annotations

from difflib import SequenceMatcher

# Offline: the tasks are these words, nothing is downloaded.
WORDS = (
    "apple", "river", "stone", "cloud", "garden", "pencil", "window", "orange",
    "silver", "candle", "forest", "bridge", "mirror", "rocket", "planet", "winter",
)

SYSTEM_PROMPT = "Reverse the text the user gives, letter by letter. Reply with the reversed text only."


def target(text: str) -> str:
    return text[::-1]


def score(reply: str, text: str) -> float:
    """Partial credit: the similarity ratio (0 to 1) of the stripped reply and the reversed text, so a reply
    that is nearly right scores nearly 1."""
    return SequenceMatcher(None, reply.strip(), target(text)).ratio()
