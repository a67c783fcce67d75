"""Data model of context tracking: what the server records per call, and the samples built from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NO_VERSION = -1  # a token that no policy generated (prompt, tool output) has no version


@dataclass
class CallRecord:
    """One model call inside an episode, exactly as the model saw and produced it, whatever API it came through
    (chat completions, Responses, Anthropic Messages, legacy completions: all recorded the same way)."""

    call_index: int  # order within the episode
    agent: str  # agent / role name ("default" when none was given)
    messages: list[dict[str, Any]]  # the request's messages, normalised (content as a string)
    tools: list[dict[str, Any]] | None  # the request's tools (OpenAI format), None when absent
    prompt_ids: list[int]  # the exact prompt the engine received (chat template applied)
    completion_ids: list[int]  # the exact generated token ids (end-of-turn token included when emitted)
    completion_logprobs: list[float]  # behaviour logprobs of completion_ids
    temperature: float  # the temperature the logprobs refer to (1.0 for greedy)
    policy_version: int  # the policy that generated the completion (its oldest token's, when it spans updates)
    response_message: dict[str, Any]  # the assistant message returned to the client
    finish_reason: str = "stop"
    completion_versions: list[int] | None = None  # the policy version of each completion id (None: policy_version)
    api: str = "chat.completions"  # the API the call came through (the trace shows it per call)

    @property
    def versions(self) -> list[int]:
        """One policy version per completion id."""
        if self.completion_versions is None:
            return [self.policy_version] * len(self.completion_ids)
        return list(self.completion_versions)


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
    # The policy version that generated each token of input_ids (NO_VERSION on prompt, tool and other tokens the
    # model did not generate here); None for samples stored before versions were kept per token: see ``versions``.
    token_versions: list[int] | None = None

    @property
    def versions(self) -> list[int]:
        """One policy version per token (``NO_VERSION`` where none). A sample stored without them counts every
        trained token at ``min_policy_version`` (what was known then)."""
        if self.token_versions is not None:
            return list(self.token_versions)
        return [self.min_policy_version if m else NO_VERSION for m in self.loss_mask]
