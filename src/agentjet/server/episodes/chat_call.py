"""A chat completion as a domain operation: the request validated against its episode (the key, the agent
name, the messages, tools and sampling), its prompt rendered with token-in, token-out applied, the generations,
and each reply recorded on the episode. The HTTP edge (``server/http/openai_api.py``) parses the request, calls
``Chat.open`` and a ``ChatCall`` method, and renders the OpenAI-shaped answer or stream."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentjet.engines.base import MAX_SEED, Engine, GenerationResult, SamplingParams, TokenCallback
from agentjet.engines.errors import EngineUnavailableError, GenerationError
from agentjet.protocol import DEFAULT_AGENT
from agentjet.server.episodes.chat import (
    ChatFormatError,
    ChatFormatter,
    normalize_messages,
    validate_tool_choice,
    validate_tools,
)
from agentjet.server.episodes.ingest import Ingest
from agentjet.server.episodes.keys import EpisodeKeys
from agentjet.server.episodes.registry import Episode, EpisodeRegistry
from agentjet.server.errors import APIError, bad_request, conflict, unavailable
from agentjet.settings import ServerConfig
from agentjet.tracking import CallRecord


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = Field(default=None, max_length=200)
    messages: list[Any]
    tools: list[Any] | None = None
    tool_choice: Any = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=2**31 - 1)  # and at most the vocabulary (checked below)
    max_tokens: int | None = Field(default=None, ge=1, le=2**31 - 1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=2**31 - 1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, lt=MAX_SEED)
    n: int = Field(default=1, ge=1, le=16)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


MAX_STOP_CHARS = 1000


def agent_name(header: str | None, body: ChatCompletionRequest, config: ServerConfig) -> str:
    """The agent (role) of a call: the ``X-Agent-Name`` header, else the ``model`` field when it names neither
    the served model nor the default agent."""
    if header:
        name = header.strip()
    elif body.model and body.model not in (config.name, config.model, DEFAULT_AGENT):
        name = body.model
    else:
        name = DEFAULT_AGENT
    if not name or len(name) > 200:
        raise bad_request("the agent name must be 1 to 200 characters", param="model")
    return name


def _unsupported(body: ChatCompletionRequest) -> None:
    if body.presence_penalty or body.frequency_penalty:
        raise bad_request("presence_penalty and frequency_penalty are not supported: they would change the "
                          "sampling distribution the trainer reproduces", param="presence_penalty")
    if body.logit_bias:
        raise bad_request("logit_bias is not supported", param="logit_bias")
    if body.response_format and body.response_format.get("type", "text") != "text":
        raise bad_request("only response_format {'type': 'text'} is supported", param="response_format")
    if body.stream and body.n > 1:
        raise bad_request("stream with n > 1 is not supported; send n separate requests", param="n")
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs requires logprobs: true", param="top_logprobs")


def sampling_for(body: ChatCompletionRequest, config: ServerConfig, engine: Engine, prompt_len: int,
                 index: int) -> SamplingParams:
    d = config.sampling
    room = engine.max_context - prompt_len
    if room < 1:
        raise bad_request(f"the prompt has {prompt_len} tokens, which fills the model's context of "
                          f"{engine.max_context} tokens", param="messages", code="context_length_exceeded")
    asked = body.max_completion_tokens or body.max_tokens
    if asked is not None and asked > room:
        raise bad_request(f"max_tokens={asked} plus the prompt's {prompt_len} tokens exceeds the model's context of "
                          f"{engine.max_context} tokens (at most {room})", param="max_tokens",
                          code="context_length_exceeded")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if len(stop) > 4 or any(not s or len(s) > MAX_STOP_CHARS for s in stop):
        raise bad_request(f"stop must be up to 4 non-empty strings of at most {MAX_STOP_CHARS} characters",
                          param="stop")
    vocab = len(engine.tokenizer)
    if body.top_k and body.top_k > vocab:
        raise bad_request(f"top_k must be at most the vocabulary size {vocab} (got {body.top_k})", param="top_k")
    return SamplingParams(
        temperature=body.temperature if body.temperature is not None else d.temperature,
        top_p=body.top_p if body.top_p is not None else d.top_p,
        top_k=body.top_k or 0,
        max_tokens=asked or min(d.max_tokens, room),
        stop=stop,
        seed=None if body.seed is None else (body.seed + index) % MAX_SEED,
        top_logprobs=(body.top_logprobs or 0) if body.logprobs else 0,
    )


def engine_error(exc: Exception) -> APIError:
    """An engine failure as an HTTP error: the request's own fault is a 400 naming its parameter; anything
    else is the engine's (503, retry later), never a 500."""
    if isinstance(exc, GenerationError):
        return bad_request(str(exc), param=exc.param)
    if isinstance(exc, ValueError):
        return bad_request(str(exc), param="messages")
    if isinstance(exc, EngineUnavailableError):  # e.g. the vLLM subprocess crashed and is restarting
        return unavailable(f"the engine is unavailable: {exc}", "engine_unavailable",
                           retry_after_s=exc.retry_after_s if exc.retry_after_s is not None else 5)
    return unavailable(f"the engine failed on this request ({type(exc).__name__}); retry later", "engine_error",
                       retry_after_s=1)


@dataclass(frozen=True)
class Reply:
    """One generated choice: the engine's result, the assistant message parsed from it, its finish reason."""

    result: GenerationResult
    message: dict[str, Any]
    finish_reason: str


class Chat:
    """The parts a chat call uses, built once by ``SwarmServer``."""

    def __init__(self, config: ServerConfig, engine: Engine, formatter: ChatFormatter, keys: EpisodeKeys,
                 registry: EpisodeRegistry, ingest: Ingest,
                 engine_for: Callable[[str], Engine] | None = None) -> None:
        """``engine_for(agent)``: the engine that serves an agent's calls (a server with several LoRA adapters
        routes each agent to its adapter's, or refuses it with a 4xx); by default ``engine`` serves every agent."""
        self.config = config
        self.engine = engine
        self.engine_for = engine_for or (lambda _agent: engine)
        self.formatter = formatter
        self.keys = keys
        self.registry = registry
        self.ingest = ingest

    async def open(self, body: ChatCompletionRequest, key: str | None, agent_header: str | None) -> ChatCall:
        """Validate the call against its episode, then put this agent's earlier generations back into the prompt
        as generated (token-in, token-out; ``agentjet.server.episodes.tito``)."""
        call = ChatCall(self, body, key, agent_header)
        ids = await self.ingest.tito_prompt_ids(call.episode, call.agent, call.messages, call.tools, call.prompt_ids)
        if ids is not call.prompt_ids:
            call.prompt_ids = ids
            call.sampling = call.sampling_plan()
        return call


class ChatCall:
    """One chat completion request, validated and rendered to prompt ids, with what it needs to generate,
    record each reply and shape the answer."""

    def __init__(self, chat: Chat, body: ChatCompletionRequest, key: str | None, agent_header: str | None) -> None:
        self.chat = chat
        config = chat.config
        self.episode: Episode = chat.keys.open_by_key(key)
        _unsupported(body)
        if len(body.messages) > config.max_messages:
            raise bad_request(f"at most {config.max_messages} messages per request", param="messages")
        self.body = body
        self.agent = agent_name(agent_header, body, config)
        self.engine = chat.engine_for(self.agent)  # its adapter's engine (a 4xx when no adapter serves it)
        try:
            self.messages = normalize_messages(body.messages)
            self.tools = validate_tools(body.tools)
            validate_tool_choice(body.tool_choice, self.tools)
            self.prompt_ids = chat.formatter.prompt_ids(self.messages, self.tools)
        except ChatFormatError as exc:
            raise bad_request(str(exc), param=exc.param) from exc
        self.sampling = self.sampling_plan()
        self.parse_tools = bool(self.tools) and body.tool_choice != "none"
        self.created = int(time.time())
        self.id = "chatcmpl-" + uuid.uuid4().hex

    def sampling_plan(self) -> list[SamplingParams]:
        """One ``SamplingParams`` per choice (``n``), for the current prompt."""
        return [sampling_for(self.body, self.chat.config, self.chat.engine, len(self.prompt_ids), i)
                for i in range(self.body.n)]

    def begin(self) -> None:
        """The call is in flight on its episode from now (its lease cannot expire meanwhile) until ``end``."""
        self.episode.inflight += 1
        self.chat.registry.touch(self.episode)

    def end(self) -> None:
        self.episode.inflight -= 1
        self.chat.registry.touch(self.episode)

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        self.begin()
        try:
            yield
        finally:
            self.end()

    async def complete(self) -> list[Reply]:
        """Generate every choice, then record each on the episode (a 409 if the episode closed meanwhile)."""
        with self.in_flight():
            try:
                results = await asyncio.gather(*[self.engine.generate(self.prompt_ids, s, session=self.session)
                                                 for s in self.sampling])
            except Exception as exc:
                raise engine_error(exc) from exc
        if not self.episode.is_open:
            raise conflict(f"episode {self.episode.episode_id} was {self.episode.status.value} during the call",
                           "episode_closed")
        return [self.reply(res, s) for res, s in zip(results, self.sampling, strict=True)]

    async def generate(self, on_token: TokenCallback) -> GenerationResult:
        """The first choice, each token to ``on_token`` as it is produced (a stream; ``n`` is 1)."""
        return await self.engine.generate(self.prompt_ids, self.sampling[0], on_token=on_token, session=self.session)

    @property
    def session(self) -> str:
        """What a fleet of replicas routes the call by: its episode (every call of an episode on one replica)."""
        return self.episode.episode_id

    def reply(self, result: GenerationResult, sampling: SamplingParams) -> Reply:
        """The assistant message of ``result``, recorded on the episode when it is still open."""
        message = self.assistant_message(result)
        if self.episode.is_open:
            self.record(result, message, sampling)
        finish = "tool_calls" if message.get("tool_calls") else result.finish_reason.value
        return Reply(result, message, finish)

    def assistant_message(self, result: GenerationResult) -> dict[str, Any]:
        content, tool_calls = self.chat.formatter.parse_reply(result.text, result.token_ids, self.parse_tools)
        msg: dict[str, Any] = {"role": "assistant", "content": content if (content or not tool_calls) else None}
        if tool_calls:
            msg["tool_calls"] = tool_calls
        return msg

    def record(self, result: GenerationResult, message: dict[str, Any], sampling: SamplingParams) -> None:
        # Record what the template really rendered (tools folded into messages where the template has no
        # tool support), so that context tracking re-renders exactly these prompt ids.
        fmt = self.chat.formatter
        messages, tools = fmt.as_rendered(self.messages, self.tools)
        reply = fmt.render_messages(normalize_messages([message]), None)[0]
        call = CallRecord(
            call_index=len(self.episode.calls), agent=self.agent, messages=messages, tools=tools,
            prompt_ids=self.prompt_ids, completion_ids=list(result.token_ids),
            completion_logprobs=list(result.logprobs), temperature=sampling.logprob_temperature,
            policy_version=result.policy_version, response_message=reply,
            finish_reason=result.finish_reason.value, completion_versions=result.versions)
        self.chat.ingest.record_call(self.episode, call)
