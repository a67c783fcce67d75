"""What the server and its engine process say to each other, and how it is written: a stream of msgpack objects
over one Unix stream socket, each object a *frame* (a list of messages) so that one write carries everything a
side has to say at that moment (a decode step's tokens for every streaming row, the results that finished, the
counters). msgpack over a plain socket was chosen by measurement (``benchmarks/serving/engine_wire.py``,
docs/benchmarks.md "The engine process").

Every message is a list whose first item is its ``Kind``:

| kind       | direction      | items after the kind                                                        |
|------------|----------------|-----------------------------------------------------------------------------|
| GENERATE   | server → engine | request id, prompt ids, sampling (``encode_sampling``), stream (bool)      |
| CANCEL     | server → engine | request id (its caller went away: the row is dropped at the next step)     |
| CALL       | server → engine | call id, op (``Op``), arguments (a list)                                   |
| TOKENS     | engine → server | request ids, tokens, logprobs: one decode step's stream, row by row        |
| DONE       | engine → server | request id, the result (``encode_result``)                                 |
| FAIL       | engine → server | request id, the error (``encode_error``)                                   |
| REPLY      | engine → server | call id, ok (bool), the value or the error                                 |
| STATS      | engine → server | the generator's counters (a map)                                           |
| BEAT       | engine → server | nothing: the engine's event loop is alive (every ``BEAT_INTERVAL_S``)       |
| HELLO      | engine → server | the engine's description (a map): it is ready                              |

Token ids, logprobs (float64: exact) and per-token versions travel as plain lists. Errors keep their kind: a
``GenerationError`` (the request's own fault: a 4xx, with its parameter) stays one; anything else the engine
raises arrives as an ``EngineUnavailableError`` (503).
"""

from __future__ import annotations

import enum
from typing import Any

import msgpack

from agentjet.engines.base import FinishReason, GenerationResult, SamplingParams
from agentjet.engines.errors import EngineUnavailableError, GenerationError

BEAT_INTERVAL_S = 1.0  # how often an engine process says it is alive
MAX_FRAME_BYTES = 1 << 30  # a frame larger than this is refused (a prompt of 10M tokens is ~50 MB)


class Kind(enum.IntEnum):
    GENERATE = 1
    CANCEL = 2
    CALL = 3
    TOKENS = 4
    DONE = 5
    FAIL = 6
    REPLY = 7
    STATS = 8
    BEAT = 9
    HELLO = 10


class Op(enum.StrEnum):
    """The control calls (``CALL``) an engine process answers."""

    LOAD_WEIGHTS = "load_weights"  # [path, policy_version]: copy a safetensors export into the module in place
    STATS = "stats"  # []: the counters now
    DESCRIBE = "describe"  # []: the engine's description now
    PING = "ping"  # []: answers at once
    SHUTDOWN = "shutdown"  # []: fail what it holds, answer, exit


def pack(messages: list[list[Any]]) -> bytes:
    """One frame."""
    return msgpack.packb(messages, use_bin_type=True)


def unpacker() -> msgpack.Unpacker:
    """Feed it what a socket gives; iterate it for the complete frames."""
    return msgpack.Unpacker(raw=False, max_buffer_size=MAX_FRAME_BYTES, strict_map_key=False)


def encode_sampling(p: SamplingParams) -> list[Any]:
    return [p.temperature, p.top_p, p.top_k, p.max_tokens, list(p.stop), list(p.stop_token_ids), p.seed,
            p.top_logprobs]


def decode_sampling(v: list[Any]) -> SamplingParams:
    temperature, top_p, top_k, max_tokens, stop, stop_ids, seed, top_logprobs = v
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
                          stop=tuple(stop), stop_token_ids=tuple(stop_ids), seed=seed, top_logprobs=top_logprobs)


def encode_result(r: GenerationResult) -> list[Any]:
    top = [[list(pair) for pair in alts] for alts in r.top_logprobs] if r.top_logprobs is not None else None
    return [r.token_ids, r.logprobs, r.finish_reason.value, r.policy_version, r.text, top, r.token_versions]


def decode_result(v: list[Any]) -> GenerationResult:
    ids, logprobs, finish, version, text, top, versions = v
    return GenerationResult(token_ids=ids, logprobs=logprobs, finish_reason=FinishReason(finish),
                            policy_version=version, text=text,
                            top_logprobs=[[(t, lp) for t, lp in alts] for alts in top] if top is not None else None,
                            token_versions=versions)


def encode_error(exc: BaseException) -> list[Any]:
    """[generation?, message, param]: a request's own fault keeps its kind and parameter."""
    if isinstance(exc, GenerationError):
        return [True, str(exc), exc.param]
    return [False, f"{type(exc).__name__}: {exc}" if not isinstance(exc, EngineUnavailableError) else str(exc), None]


def decode_error(v: list[Any]) -> Exception:
    generation, message, param = v
    if generation:
        return GenerationError(message, param=param)
    return EngineUnavailableError(f"the engine process: {message}")

