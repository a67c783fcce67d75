"""Context tracking: turns an episode's recorded calls into training samples.

``build_samples`` is the one entry point the server uses.
"""

from __future__ import annotations

from agentjet.tracking.types import CallRecord, EpisodeSample


def build_samples(calls: list[CallRecord]) -> list[EpisodeSample]:
    """One sample per call: the exact prompt ids followed by the exact generated ids (no re-tokenization).

    The loss mask covers the generated tokens only."""
    samples = []
    for c in calls:
        n = len(c.prompt_ids)
        samples.append(EpisodeSample(
            input_ids=list(c.prompt_ids) + list(c.completion_ids),
            loss_mask=[0] * n + [1] * len(c.completion_ids),
            behaviour_logprobs=[0.0] * n + list(c.completion_logprobs),
            agent=c.agent,
            temperature=c.temperature,
            call_indices=[c.call_index],
            min_policy_version=c.policy_version,
        ))
    return samples


__all__ = ["CallRecord", "EpisodeSample", "build_samples"]
