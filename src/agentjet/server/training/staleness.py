"""The staleness bound, per token.

Every generated token records the policy version that sampled it (a reply that spans a weight update carries
two or more). With ``training.max_staleness = S`` and the learner at version ``V``, a token generated at a
version older than ``V - S`` is stale: it is masked out of the loss (its loss-mask entry becomes 0), and the
rest of its sample is trained on. A sample whose trained tokens are all stale leaves the batch; an episode whose
tokens are all stale is dropped before batching (``GroupPool.drop_stale``), as whole episodes were before
versions were kept per token. Pure functions: the trainer calls them, tests check them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from agentjet.server.store import StoredEpisode
from agentjet.tracking import NO_VERSION, EpisodeSample


def oldest_fresh_version(version: int, max_staleness: int) -> int:
    """The oldest policy version whose tokens are still trained on."""
    return version - max_staleness


def all_stale(ep: StoredEpisode, version: int, max_staleness: int) -> bool:
    """Every token of the episode is stale (its newest token is): the whole episode is dropped."""
    return ep.newest_version < oldest_fresh_version(version, max_staleness)


def stale_mask(sample: EpisodeSample, version: int, max_staleness: int) -> tuple[list[int], int]:
    """The sample's loss mask with its stale tokens masked out, and how many trained tokens that masked."""
    floor = oldest_fresh_version(version, max_staleness)
    mask, masked = [], 0
    for m, v in zip(sample.loss_mask, sample.versions, strict=True):
        stale = bool(m) and v != NO_VERSION and v < floor
        mask.append(0 if stale else m)
        masked += stale
    return mask, masked


@dataclass
class FreshSamples:
    """One episode-agent's samples after the per-token bound: the ones still trained (with their stored index
    and their stale tokens masked out), and the counts behind the step's ``staleness/masked_token_share``."""

    kept: list[tuple[int, EpisodeSample]] = dataclasses.field(default_factory=list)
    tokens: int = 0  # trained tokens before the bound
    masked: int = 0  # of those, masked as stale


def fresh_samples(samples: list[tuple[int, EpisodeSample]], version: int, max_staleness: int) -> FreshSamples:
    """Apply the per-token bound to ``(index, sample)`` pairs. A sample whose trained tokens were all stale is
    left out; one that had no trained token to begin with is kept as it is."""
    out = FreshSamples()
    for i, s in samples:
        mask, masked = stale_mask(s, version, max_staleness)
        trained = sum(s.loss_mask)
        out.tokens += trained
        out.masked += masked
        if masked and masked == trained:
            continue
        out.kept.append((i, dataclasses.replace(s, loss_mask=mask) if masked else s))
    return out


def logprobs_on_stored_mask(used: list[float] | None, stored_mask: list[int], used_mask: list[int]
                            ) -> list[float] | None:
    """The trainer's logprobs of a sample (one per token of ``used_mask``) laid out on the stored sample's
    trained tokens (``stored_mask``), NaN where a token was masked as stale, so that the trace viewer keeps
    each logprob on its own token."""
    if used is None:
        return None
    it = iter(used)
    return [next(it, math.nan) if u else math.nan for m, u in zip(stored_mask, used_mask, strict=True) if m]


__all__ = ["FreshSamples", "all_stale", "fresh_samples", "logprobs_on_stored_mask", "oldest_fresh_version",
           "stale_mask"]
