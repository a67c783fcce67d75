"""Options of context tracking."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class CompareLevel(enum.StrEnum):
    """How a short timeline is recognised as a prefix of a longer one.

    ``TOKEN`` (default): the short call's prompt + output ids (after drift repair) are a prefix of the long call's
    prompt ids. Every absorbed call is reproduced token for token (the model saw exactly that context).

    ``TEXT``: the short call's messages + reply are a prefix of the long call's messages (message text, tool-call
    ids ignored) and the reply's generated ids sit in the long call's prompt (after drift repair). Also merges
    when the context tokens differ but the messages do not (e.g. a changed tool list with ``ignore_tools``): the
    absorbed call's output is trained in the long call's rendering of the same conversation
    (``stats["call_spans"][i]["exact_context"]`` is False for such calls).
    """

    TOKEN = "token"
    TEXT = "text"


WEIGHT_MODES = ("per_episode", "none", "per_sample")


@dataclass
class TrackingConfig:
    merge: bool = True  # merge timelines; False = one sample per call
    compare_level: CompareLevel = CompareLevel.TOKEN
    ignore_tools: bool = True  # False: a change of the tools list blocks a merge even when the tokens agree
    fix_drift: bool = True  # put the generated ids back where the prompt holds a re-tokenization
    weighting: str = "per_episode"  # see agentjet.tracking.weights.episode_weights

    def __post_init__(self) -> None:
        self.compare_level = CompareLevel(self.compare_level)
        if self.weighting not in WEIGHT_MODES:
            raise ValueError(f"weighting must be one of {WEIGHT_MODES}, got {self.weighting!r}")
