"""A model call as a domain operation, whatever API it came through: the request validated against its episode
(the key, the agent name, the messages, tools and sampling), its prompt rendered with token-in, token-out
applied, the generations, and each reply recorded on the episode. Each API's route at the HTTP edge
(``server/http/``: chat completions, Responses, Anthropic Messages, legacy completions) parses its own body into
one API-neutral ``CallRequest``, calls ``Chat.open`` and a ``ChatCall`` method, and renders the answer or the
stream in that API's own shape."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from agentjet.engines.base import (
    MAX_SEED,
    Engine,
    FinishReason,
    GenerationResult,
    SamplingParams,
    TokenCallback,
    TrainSample,
)
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
from agentjet.server.episodes.stored import StoredCall, stored_history
from agentjet.server.errors import APIError, bad_request, conflict, unavailable
from agentjet.settings import ServerConfig
from agentjet.tracking import CallRecord


class Api(enum.StrEnum):
    """The API a call came through (recorded on its ``CallRecord``; the trace shows it)."""

    CHAT = "chat.completions"
    RESPONSES = "responses"
    MESSAGES = "messages"
    COMPLETIONS = "completions"


# how each API names the request fields the domain's errors name (the chat names by default)
_PARAM_NAMES: Mapping[Api, Mapping[str, str]] = MappingProxyType({
    Api.RESPONSES: MappingProxyType({"max_tokens": "max_output_tokens", "messages": "input"}),
    Api.MESSAGES: MappingProxyType({"stop": "stop_sequences"}),
    Api.COMPLETIONS: MappingProxyType({"messages": "prompt"}),
})
_ID_PREFIX: Mapping[Api, str] = MappingProxyType({Api.CHAT: "chatcmpl-", Api.RESPONSES: "resp_",
                                                  Api.MESSAGES: "msg_", Api.COMPLETIONS: "cmpl-"})


@dataclass(frozen=True)
class CallRequest:
    """One model call, API-neutral: what each API's parser at the HTTP edge builds from its own body (chat
    completions, Responses, Anthropic Messages, legacy completions), and all a ``ChatCall`` needs."""

    api: Api
    messages: list[Any] = field(default_factory=list)  # chat-shaped messages (normalised by the call)
    instructions: str | None = None  # a system message put first (Responses' instructions, Messages' system)
    prompt_ids: list[int] | None = None  # legacy completions: the prompt's ids as given (no messages, no template)
    tools: list[Any] | None = None  # chat-shaped function tools
    tool_choice: Any = None  # chat-shaped: none / auto / required / {"type": "function", "function": {"name"}}
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = 1
    logprobs: bool = False
    top_logprobs: int | None = None
    stream: bool = False
    clamp_max_tokens: bool = False  # a max_tokens beyond the room left is cut to it (else a 400)
    previous_response_id: str | None = None  # continue the conversation of a stored call of this episode
    store: bool = False  # keep this call's input and reply with the episode (``episodes/stored.py``)

    def param(self, name: str) -> str:
        """The request field ``name`` as this call's API names it (for the errors)."""
        return _PARAM_NAMES.get(self.api, {}).get(name, name)


MAX_STOP_CHARS = 1000


def agent_name(header: str | None, model: str | None, config: ServerConfig) -> str:
    """The agent (role) of a call: the ``X-Agent-Name`` header, else the ``model`` field when it names neither
    the served model nor the default agent."""
    if header:
        name = header.strip()
    elif model and model not in (config.name, config.model, DEFAULT_AGENT):
        name = model
    else:
        name = DEFAULT_AGENT
    if not name or len(name) > 200:
        raise bad_request("the agent name must be 1 to 200 characters", param="model")
    return name


def prompt_too_long(request: CallRequest, prompt_len: int, max_context: int) -> APIError:
    """The prompt leaves no room to generate: in Anthropic's words for Messages (what a harness acts on)."""
    if request.api is Api.MESSAGES:
        return bad_request(f"prompt is too long: {prompt_len} tokens > {max_context - 1} maximum",
                           param="messages", code="context_length_exceeded")
    return bad_request(f"the prompt has {prompt_len} tokens, which fills the model's context of {max_context} "
                       "tokens", param=request.param("messages"), code="context_length_exceeded")


def sampling_for(request: CallRequest, config: ServerConfig, engine: Engine, prompt_len: int,
                 index: int) -> SamplingParams:
    d = config.sampling
    room = engine.max_context - prompt_len
    if room < 1:
        raise prompt_too_long(request, prompt_len, engine.max_context)
    asked = request.max_tokens
    if asked is not None and asked > room:
        if not request.clamp_max_tokens:
            raise bad_request(f"{request.param('max_tokens')}={asked} plus the prompt's {prompt_len} tokens exceeds "
                              f"the model's context of {engine.max_context} tokens (at most {room})",
                              param=request.param("max_tokens"), code="context_length_exceeded")
        asked = room  # Messages and Responses: the room left (the reply then stops at the limit)
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    if len(stop) > 4 or any(not s or len(s) > MAX_STOP_CHARS for s in stop):
        raise bad_request(f"{request.param('stop')} must be up to 4 non-empty strings of at most {MAX_STOP_CHARS} "
                          "characters", param=request.param("stop"))
    vocab = len(engine.tokenizer)
    if request.top_k and request.top_k > vocab:
        raise bad_request(f"top_k must be at most the vocabulary size {vocab} (got {request.top_k})", param="top_k")
    return SamplingParams(
        temperature=request.temperature if request.temperature is not None else d.temperature,
        top_p=request.top_p if request.top_p is not None else d.top_p,
        top_k=request.top_k or 0,
        max_tokens=asked or min(d.max_tokens, room),
        stop=stop,
        seed=None if request.seed is None else (request.seed + index) % MAX_SEED,
        top_logprobs=(request.top_logprobs or 0) if request.logprobs else 0,
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


@dataclass(frozen=True)
class Prompt:
    """A call's input, rendered: the conversation the model sees and its prompt ids."""

    own: list[dict[str, Any]]  # this request's messages, normalised (what a stored call keeps)
    messages: list[dict[str, Any]]  # the conversation: instructions, a stored call's history, then ``own``
    tools: list[dict[str, Any]] | None
    ids: list[int]


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

    async def open(self, request: CallRequest, key: str | None, agent_header: str | None) -> ChatCall:
        """Validate the call against its episode, then put this agent's earlier generations back into the prompt
        as generated (token-in, token-out; ``agentjet.server.episodes.tito``)."""
        call = ChatCall(self, request, key, agent_header)
        if request.prompt_ids is not None:
            return call  # legacy completions: the ids as given
        ids = await self.ingest.tito_prompt_ids(call.episode, call.agent, call.messages, call.tools, call.prompt_ids)
        if ids is not call.prompt_ids:
            call.prompt_ids = ids
            call.sampling = call.sampling_plan()
        return call

    def count_tokens(self, request: CallRequest, key: str | None) -> int:
        """The prompt's length in tokens, as a call with this request would render it (nothing generated)."""
        return len(self.render(request, self.context(self.keys.open_by_key(key), request)).ids)

    def context(self, episode: Episode, request: CallRequest) -> list[dict[str, Any]]:
        """What comes before the request's own messages: its instructions as a system message, then the
        conversation of the stored call it continues (``previous_response_id``). At most ``max_messages`` in all."""
        if request.prompt_ids is not None:
            return []
        history = (stored_history(episode.stored, request.previous_response_id, self.config.max_messages)
                   if request.previous_response_id else [])
        system = [{"role": "system", "content": request.instructions}] if request.instructions else []
        if len(system) + len(history) + len(request.messages) > self.config.max_messages:
            raise bad_request(f"at most {self.config.max_messages} messages per request",
                              param=request.param("messages"))
        return system + history

    def render(self, request: CallRequest, context: list[dict[str, Any]]) -> Prompt:
        """The conversation (``context``, then the request's own messages) through the model's chat template;
        legacy completions' ids as given."""
        if request.prompt_ids is not None:
            return Prompt([], [], None, self._given_ids(request.prompt_ids))
        try:
            own = normalize_messages(request.messages) if request.messages or not context else []
            messages = context + own
            tools = validate_tools(request.tools)
            validate_tool_choice(request.tool_choice, tools)
            return Prompt(own, messages, tools, self.formatter.prompt_ids(messages, tools))
        except ChatFormatError as exc:
            raise bad_request(str(exc), param=request.param("messages") if exc.param == "messages" else exc.param
                              ) from exc

    def _given_ids(self, ids: list[int]) -> list[int]:
        vocab = len(self.formatter.tokenizer)
        if not ids:
            raise bad_request("the prompt is empty", param="prompt")
        if any(not 0 <= t < vocab for t in ids):
            raise bad_request(f"the prompt's token ids must be in 0..{vocab - 1}", param="prompt")
        return list(ids)


class ChatCall:
    """One model call, validated and rendered to prompt ids, with what it needs to generate, record each reply
    and shape the answer. Every API's route opens one (``Chat.open``) from its own ``CallRequest``."""

    def __init__(self, chat: Chat, request: CallRequest, key: str | None, agent_header: str | None) -> None:
        self.chat = chat
        self.episode: Episode = chat.keys.open_by_key(key)
        self.request = request
        context = chat.context(self.episode, request)
        self.agent = agent_name(agent_header, request.model, chat.config)
        self.engine = chat.engine_for(self.agent)  # its adapter's engine (a 4xx when no adapter serves it)
        prompt = chat.render(request, context)
        self.own_messages, self.messages, self.tools = prompt.own, prompt.messages, prompt.tools
        self.prompt_ids = prompt.ids
        self.sampling = self.sampling_plan()
        self.parse_tools = bool(self.tools) and request.tool_choice != "none"
        self.created = int(time.time())
        self.id = _ID_PREFIX[request.api] + uuid.uuid4().hex

    def sampling_plan(self) -> list[SamplingParams]:
        """One ``SamplingParams`` per choice (``n``), for the current prompt."""
        return [sampling_for(self.request, self.chat.config, self.chat.engine, len(self.prompt_ids), i)
                for i in range(self.request.n)]

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

    async def prompt_logprobs(self) -> list[float]:
        """The current policy's logprob of each prompt token after the first (teacher forcing, the learner's
        scoring path; nothing is recorded): legacy completions' ``echo`` with ``logprobs``."""
        n = len(self.prompt_ids)
        if n < 2:
            return []
        sample = TrainSample(list(self.prompt_ids), [0] + [1] * (n - 1), [0.0] * n, [0.0] * n)
        with self.in_flight():
            try:
                (scored,) = await self.engine.learner.score([sample])
            except Exception as exc:
                raise engine_error(exc) from exc
        return [float(x) for x in scored]

    def reply(self, result: GenerationResult, sampling: SamplingParams) -> Reply:
        """The assistant message of ``result``, recorded on the episode when it is still open (and stored with
        it when the request asked to store it)."""
        message = self.assistant_message(result)
        if self.episode.is_open:
            self.record(result, message, sampling)
            if self.request.store:
                self.episode.stored[self.id] = StoredCall(self.request.previous_response_id, self.own_messages,
                                                          normalize_messages([message])[0])
        finish = "tool_calls" if message.get("tool_calls") else result.finish_reason.value
        return Reply(result, message, finish)

    def stop_sequence(self, result: GenerationResult) -> str | None:
        """The stop string that ended ``result``, if one did (not the end-of-turn token or the limit)."""
        stops = self.sampling[0].stop
        if result.finish_reason is not FinishReason.STOP or not stops:
            return None
        full = self.chat.formatter.tokenizer.decode(list(result.token_ids), skip_special_tokens=True)
        return next((s for s in stops if full.startswith(s, len(result.text))), None)

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
            finish_reason=result.finish_reason.value, completion_versions=result.versions,
            api=self.request.api.value)
        self.chat.ingest.record_call(self.episode, call)
