"""Data model of context tracking: what the server records per call, and the samples built from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CallRecord:
    """One chat-completion call inside an episode, exactly as the model saw and produced it."""

    call_index: int  # order within the episode
    agent: str  # agent / role name ("default" when none was given)
    messages: list[dict[str, Any]]  # the request's messages, normalised (content as a string)
    tools: list[dict[str, Any]] | None  # the request's tools (OpenAI format), None when absent
    prompt_ids: list[int]  # the exact prompt the engine received (chat template applied)
    completion_ids: list[int]  # the exact generated token ids (end-of-turn token included when emitted)
    completion_logprobs: list[float]  # behaviour logprobs of completion_ids
    temperature: float  # the temperature the logprobs refer to (1.0 for greedy)
    policy_version: int  # the policy that generated the completion
    response_message: dict[str, Any]  # the assistant message returned to the client
    finish_reason: str = "stop"


@dataclass
class EpisodeSample:
    """A training sequence built from one or more calls of one agent in one episode."""

    input_ids: list[int]
    loss_mask: list[int]  # 1 on every generated token (of every absorbed call), else 0
    behaviour_logprobs: list[float]  # recorded logprob where loss_mask == 1, else 0.0
    agent: str
    temperature: float
    call_indices: list[int]  # the calls this sample covers (merged calls listed in order)
    min_policy_version: int  # the oldest policy that generated any trained token
    stats: dict[str, Any] = field(default_factory=dict)  # merge / drift statistics
    weight: float = 1.0  # loss weight (agentjet.tracking.weights.episode_weights); feeds TrainSample.weight
