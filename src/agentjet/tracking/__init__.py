"""Context tracking: turns an episode's recorded calls into training samples.

``track_episode`` is the entry point the server uses (``server/episodes/ingest.py``): the samples and a
``TrackingReport``. ``build_samples`` returns the samples alone.

- ``segment``: message spans in the rendered prompt, for any chat template.
- ``drift``: re-tokenization drift detection and repair (token-in, token-out), ``tito_prompt_ids`` for servers.
- ``timeline``: timelines, prefix merging (minimum chain cover), samples and the episode report.
- ``weights``: per-episode loss weights.  ``trace``: a JSON view of a sample.
"""

from __future__ import annotations

from agentjet.tracking.config import CompareLevel, TrackingConfig
from agentjet.tracking.drift import RepairedPrompt, repair_prompt, tito_prompt_ids
from agentjet.tracking.keys import message_key
from agentjet.tracking.segment import MessageSpan, Segmentation, segment_messages
from agentjet.tracking.timeline import TrackingReport, build_samples, track_episode
from agentjet.tracking.trace import sample_trace
from agentjet.tracking.types import NO_VERSION, CallRecord, EpisodeSample
from agentjet.tracking.weights import episode_weights

__all__ = [
    "NO_VERSION",
    "CallRecord",
    "CompareLevel",
    "EpisodeSample",
    "MessageSpan",
    "RepairedPrompt",
    "Segmentation",
    "TrackingConfig",
    "TrackingReport",
    "build_samples",
    "episode_weights",
    "message_key",
    "repair_prompt",
    "sample_trace",
    "segment_messages",
    "tito_prompt_ids",
    "track_episode",
]
