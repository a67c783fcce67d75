"""The Tinker training API (``/api/v1``) for the official ``tinker`` SDK (issue 35; see ``docs/tinker.md``).

Served only when the server has a ``--tinker-key``; otherwise every ``/api/v1`` path answers 404 naming the flag.
Auth is the SDK's ``X-API-Key`` header: a wrong or missing key is a 401 (never 408/409/429/5xx, which the SDK
retries for minutes). Bad input is a 4xx, or a failed future with an error and a category; never a 5xx."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from fastapi.routing import APIRoute

from agentjet.engines.base import SamplingParams
from agentjet.server.http.errors import tinker_error_body
from agentjet.server.swarm import SwarmServer
from agentjet.server.tinker import TinkerError, TinkerModel, TinkerService
from agentjet.server.tinker.runs import user_metadata

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")

router = APIRouter(prefix="/api/v1", include_in_schema=False)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(tinker_error_body(message), status_code=status)


def _service(request: Request) -> TinkerService | JSONResponse:
    server: SwarmServer = request.app.state.swarm
    service = server.tinker
    if service is None:
        return _error(404, "the Tinker API is off on this server: start it with --tinker-key tml-... "
                           "(or AGENTJET_TINKER_KEY / --tinker-key-file)")
    if not service.key_ok(request.headers.get("x-api-key")):
        return _error(401, "a valid Tinker API key is required (X-API-Key: tml-...; the server's --tinker-key)")
    return service


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise TinkerError(f"the body is not JSON: {e}") from e
    if not isinstance(data, dict):
        raise TinkerError("the body must be a JSON object")
    return data


def _str(body: dict[str, Any], key: str) -> str:
    v = body.get(key)
    if not isinstance(v, str) or not v:
        raise TinkerError(f"{key} must be a non-empty string")
    return v


def _int(body: dict[str, Any], key: str, default: int | None = None) -> int | None:
    v = body.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TinkerError(f"{key} must be an integer")
    return v


def _queued(s: TinkerService, model: TinkerModel, body: dict[str, Any],
            work: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
    """Queue ``work`` in ``model``'s ``seq_id`` order; the answer the SDK polls ``retrieve_future`` with."""
    return {"request_id": s.futures.submit(model.model_id, work, _int(body, "seq_id")), "model_id": model.model_id}


async def _handle(request: Request, handler: Any) -> Response:
    service = _service(request)
    if isinstance(service, JSONResponse):
        return service
    try:
        body = await _body(request)
        result = await handler(service, body)
    except TinkerError as e:
        return _error(e.status if 400 <= e.status < 500 else 400, e.message)
    if isinstance(result, Response):
        return result
    return JSONResponse(result)


# ---------------------------------------------------------------------------------------------- the handshake
@router.post("/client/config")
async def client_config(request: Request) -> Response:
    async def h(_: TinkerService, __: dict[str, Any]) -> dict[str, Any]:
        # plain httpx transport; no JWT exchange; fwd/bwd bodies uncompressed JSON
        return {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "use_pyqwest_transport": False,
                "proto_compress_fwdbwd": False, "sample_use_retrieve_futures": False,
                "custom_loss_server_side": False, "sample_join_sampling_session": False}
    return await _handle(request, h)


@router.post("/client/dynamic_config")
async def client_dynamic_config(request: Request) -> Response:
    return await _handle(request, _empty)


async def _empty(_: TinkerService, __: dict[str, Any]) -> dict[str, Any]:
    return {}


@router.get("/healthz")
async def healthz(request: Request) -> Response:
    async def h(_: TinkerService, __: dict[str, Any]) -> dict[str, Any]:
        return {"status": "ok"}
    return await _handle(request, h)


@router.get("/get_server_capabilities")
async def get_server_capabilities(request: Request) -> Response:
    async def h(s: TinkerService, _: dict[str, Any]) -> dict[str, Any]:
        # the served name, and the local directory it was loaded from (what a client passes as base_model AND loads
        # its tokenizer from offline: the cookbook's model_name); both name the same model
        model = {"max_context_length": s.max_context, "trainable": s.adapters is not None, "sampleable": True}
        names = dict.fromkeys((s.served_name, s.model_path))
        return {"supported_models": [{"model_name": name, **model} for name in names if name]}
    return await _handle(request, h)


@router.post("/create_session")
async def create_session(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        tags = body.get("tags") or []
        if not isinstance(tags, list):
            raise TinkerError("tags must be a list of strings")
        session = s.create_session([str(t) for t in tags])
        return {"type": "create_session", "session_id": session.session_id}
    return await _handle(request, h)


@router.post("/session_heartbeat")
async def session_heartbeat(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        s.heartbeat(_str(body, "session_id"))
        return {"type": "session_heartbeat"}
    return await _handle(request, h)


@router.post("/sessions/{session_id}/finish")
async def finish_session(session_id: str, request: Request) -> Response:
    async def h(s: TinkerService, _: dict[str, Any]) -> dict[str, Any]:
        await s.finish(session_id)
        return {}
    return await _handle(request, h)


@router.post("/telemetry")
async def telemetry(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        s.client_errors.record(body)  # the error events go to the server's log (rate-limited); the rest is dropped
        return {"status": "accepted"}
    return await _handle(request, h)


# ---------------------------------------------------------------------------------------------- models
@router.post("/create_model")
async def create_model(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        session_id, base_model = _str(body, "session_id"), _str(body, "base_model")
        s.sessions.get(session_id)
        lora = body.get("lora_config")
        if lora is not None and not isinstance(lora, dict):
            raise TinkerError("lora_config must be an object")
        rank = _int(lora, "rank") if lora is not None else None
        flags = {k: bool(lora.get(k, True)) for k in ("train_mlp", "train_attn", "train_unembed")} if lora else {}
        metadata = user_metadata(body.get("user_metadata"))

        async def work() -> dict[str, Any]:
            model = await s.models.create(session_id, base_model, rank, flags, metadata)
            return {"type": "create_model", "model_id": model.model_id}

        return {"request_id": s.futures.submit(None, work)}
    return await _handle(request, h)


@router.post("/get_info")
async def get_info(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        m = s.models.get(_str(body, "model_id"))
        # tokenizer_id: the local directory the server loaded (AutoTokenizer loads it offline on this machine)
        return {"type": "get_info", "model_id": m.model_id, "lora_rank": m.rank, "is_lora": True,
                "model_name": s.served_name,
                "model_data": {"arch": "causal_lm", "model_name": s.served_name, "tokenizer_id": s.model_path}}
    return await _handle(request, h)


# ---------------------------------------------------------------------------------------------- futures
@router.post("/retrieve_future")
async def retrieve_future(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> Any:
        rid = _str(body, "request_id")
        fut = await s.futures.retrieve(rid)
        if fut is None:
            return {"type": "try_again", "request_id": rid, "queue_state": "active"}
        if fut.error is not None:
            return {"error": fut.error.message, "category": fut.error.category}
        if isinstance(fut.result, bytes):
            return Response(fut.result, media_type="application/x-protobuf")
        return fut.result
    return await _handle(request, h)


# ---------------------------------------------------------------------------------------------- training
@router.post("/forward_backward")
async def forward_backward(request: Request) -> Response:
    service = _service(request)
    if isinstance(service, JSONResponse):
        return service
    from agentjet.server.tinker.wire import encode_forward_backward, parse_forward_backward

    try:
        if request.headers.get("content-encoding", "identity") not in ("identity", ""):
            raise TinkerError("compressed forward_backward bodies are not supported (the server's client/config "
                              "turns proto_compress_fwdbwd off)", 415)
        req = parse_forward_backward(await request.body())
        model = service.models.get(req.model_id)
    except TinkerError as e:
        return _error(e.status if 400 <= e.status < 500 else 400, e.message)

    async def work() -> bytes:
        result = await service.models.forward_backward(model, req.data, req.loss_fn, req.config, not req.forward_only)
        return encode_forward_backward(result)

    return JSONResponse({"request_id": service.futures.submit(model.model_id, work, req.seq_id), "model_id": model.model_id})


@router.post("/optim_step")
async def optim_step(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        model = s.models.get(_str(body, "model_id"))
        adam = body.get("adam_params", body.get("optim_params", {}))
        if not isinstance(adam, dict):
            raise TinkerError("adam_params must be an object")
        if adam.get("type", "adam") != "adam":
            raise TinkerError(f"optimizer {adam.get('type')!r} is not supported: Adam only")
        params = _adam(adam)

        async def work() -> dict[str, Any]:
            return await s.models.optim_step(model, params)

        return _queued(s, model, body, work)
    return await _handle(request, h)


ADAM_FIELDS = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")


def _adam(adam: dict[str, Any]) -> dict[str, float]:
    """Adam's parameters as numbers (a field left out or null takes its default in ``tinker_ops.optim_step``)."""
    out: dict[str, float] = {}
    for k in ADAM_FIELDS:
        v = adam.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise TinkerError(f"adam_params.{k} must be a number (got {type(v).__name__})")
        out[k] = float(v)
    return out


# ---------------------------------------------------------------------------------------------- sampling
@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        model = s.models.get(_str(body, "model_id"))
        name = body.get("path")
        if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
            raise TinkerError("path must be a name of letters, digits, _ . and - (at most 100)")
        if body.get("kind", "snapshot") != "snapshot":
            raise TinkerError(f"kind {body.get('kind')!r} is not supported: snapshot only")

        async def work() -> dict[str, Any]:
            return await s.samplers.snapshot(model, name)

        return _queued(s, model, body, work)
    return await _handle(request, h)


@router.post("/create_sampling_session")
async def create_sampling_session(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        s.sessions.get(_str(body, "session_id"))
        path, base = body.get("model_path"), body.get("base_model")
        if not isinstance(path, str | None) or not isinstance(base, str | None) or not (path or base):
            raise TinkerError("name a model_path (tinker://...) or a base_model")
        sampler = await s.samplers.create(path, base)
        return {"type": "create_sampling_session", "sampling_session_id": sampler.sampler_id}
    return await _handle(request, h)


@router.get("/samplers/{sampler_id}")
async def get_sampler(sampler_id: str, request: Request) -> Response:
    async def h(s: TinkerService, _: dict[str, Any]) -> dict[str, Any]:
        sampler = s.samplers.get(sampler_id)
        return {"sampler_id": sampler.sampler_id, "base_model": sampler.base_model, "model_path": sampler.model_path}
    return await _handle(request, h)


def _prompt(body: dict[str, Any]) -> list[int]:
    prompt = body.get("prompt")
    chunks = prompt.get("chunks") if isinstance(prompt, dict) else None
    if not isinstance(chunks, list):
        raise TinkerError("prompt must be a ModelInput: {chunks: [{type: encoded_text, tokens: [...]}]}")
    tokens: list[int] = []
    for c in chunks:
        if not isinstance(c, dict) or c.get("type", "encoded_text") != "encoded_text":
            raise TinkerError("only encoded_text prompt chunks are supported")
        ids = c.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise TinkerError("a chunk's tokens must be a list of integers")
        tokens.extend(ids)
    return tokens


def _sampling(body: dict[str, Any]) -> SamplingParams:
    p = body.get("sampling_params") or {}
    if not isinstance(p, dict):
        raise TinkerError("sampling_params must be an object")
    stop = p.get("stop")
    strings: tuple[str, ...] = ()
    ids: tuple[int, ...] = ()
    if isinstance(stop, str):
        strings = (stop,)
    elif isinstance(stop, list) and all(isinstance(x, str) for x in stop):
        strings = tuple(stop)
    elif isinstance(stop, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in stop):
        ids = tuple(stop)
    elif stop is not None:
        raise TinkerError("stop must be a string, a list of strings or a list of token ids")
    try:
        top_k = int(p.get("top_k", -1))
        return SamplingParams(temperature=float(p.get("temperature", 1.0)), top_p=float(p.get("top_p", 1.0)),
                              top_k=0 if top_k < 0 else top_k, max_tokens=int(p.get("max_tokens") or 256),
                              stop=strings, stop_token_ids=ids,
                              seed=None if p.get("seed") is None else int(p["seed"]))
    except (TypeError, ValueError) as e:  # GenerationError is a ValueError
        raise TinkerError(f"sampling_params: {e}") from e


@router.post("/asample")
async def asample(request: Request) -> Response:
    from agentjet.server.tinker.wire import encode_sample

    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        sid = body.get("sampling_session_id")
        if isinstance(sid, str) and sid:
            sampler = s.samplers.get(sid)
        else:
            path, base = body.get("model_path"), body.get("base_model")
            if not isinstance(path, str | None) or not isinstance(base, str | None) or not (path or base):
                raise TinkerError("name a sampling_session_id, a model_path or a base_model")
            sampler = await s.samplers.create(path, base)
        prompt, params = _prompt(body), _sampling(body)
        room = None if s.max_context is None else s.max_context - len(prompt)
        if room is not None and params.max_tokens > room:
            raise TinkerError(f"max_tokens={params.max_tokens} plus the prompt's {len(prompt)} tokens exceeds the "
                              f"model's context of {s.max_context} tokens (at most {max(room, 0)})")
        n = _int(body, "num_samples", 1) or 1
        if not 1 <= n <= 128:
            raise TinkerError("num_samples must be in 1..128")
        topk = _int(body, "topk_sample_logprobs", 0) or 0
        if not 0 <= topk <= 20:
            raise TinkerError("topk_sample_logprobs must be in 0..20")
        topk_prompt = _int(body, "topk_prompt_logprobs", 0) or 0
        if not 0 <= topk_prompt <= 20:
            raise TinkerError("topk_prompt_logprobs must be in 0..20")
        params = replace(params, top_logprobs=topk)
        want_plp = bool(body.get("prompt_logprobs"))
        last_n = _int(body, "prompt_logprobs_last_n")
        if last_n is not None and last_n < 0:
            raise TinkerError("prompt_logprobs_last_n must be >= 0")

        async def work() -> bytes:
            return encode_sample(await s.samplers.sample(sampler, prompt, n, params, want_plp, last_n, topk_prompt))

        rid = s.futures.submit(None, work)
        return {"request_id": rid, "sample_sequence_ids": [f"{rid}-{i}" for i in range(n)]}
    return await _handle(request, h)


# ---------------------------------------------------------------------------------------------- checkpoints
@router.post("/save_weights")
async def save_weights(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        model = s.models.get(_str(body, "model_id"))
        name = _str(body, "path")

        async def work() -> dict[str, Any]:
            return await s.checkpoints.save(model, name)

        return _queued(s, model, body, work)
    return await _handle(request, h)


@router.post("/load_weights")
async def load_weights(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("model_id") is None:  # create_training_client_from_state: a new client from a saved state
            return _from_state(s, body)
        model = s.models.get(_str(body, "model_id"))
        path = _str(body, "path")
        optimizer = bool(body.get("optimizer", False))

        async def work() -> dict[str, Any]:
            return await s.checkpoints.load(model, path, optimizer)

        return _queued(s, model, body, work)
    return await _handle(request, h)


def _from_state(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
    session_id, path = _str(body, "session_id"), _str(body, "path")
    s.sessions.get(session_id)
    seq = _int(body, "model_seq_id")
    if seq is None or seq < 0:
        raise TinkerError("load_weights without a model_id (create_training_client_from_state) needs a model_seq_id")
    base = body.get("base_model")
    if base is not None and not isinstance(base, str):
        raise TinkerError("base_model must be a string")
    optimizer = bool(body.get("optimizer", False))
    metadata = user_metadata(body.get("user_metadata"))

    async def work() -> dict[str, Any]:
        model = await s.checkpoints.create_from(session_id, seq, path, optimizer, base, metadata)
        return {"type": "load_weights", "path": path, "model_id": model.model_id}

    return {"request_id": s.futures.submit(None, work)}


# ---------------------------------------------------------------------------------------------- runs, exports
@router.get("/training_runs/{run_id}")
async def get_training_run(run_id: str, request: Request) -> Response:
    async def h(s: TinkerService, _: dict[str, Any]) -> dict[str, Any]:
        return s.training_run(run_id)
    return await _handle(request, h)


@router.post("/save_weights_external")
async def save_weights_external(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        model = s.models.get(_str(body, "model_id"))
        name = _str(body, "path")
        ttl = _int(body, "ttl_seconds")
        recipients = body.get("age_encryption_recipients")
        if recipients is not None and (not isinstance(recipients, list) or not 1 <= len(recipients) <= 10
                                       or not all(isinstance(r, str) and r for r in recipients)):
            raise TinkerError("age_encryption_recipients must be a list of 1..10 age or SSH public keys")

        async def work() -> dict[str, Any]:
            return await s.exports.save(model, name, ttl, recipients)

        return _queued(s, model, body, work)
    return await _handle(request, h)


def _external(checkpoint_id: str) -> str:
    kind, _, name = checkpoint_id.partition("/")
    if kind != "external_weights" or not name:
        raise TinkerError(f"checkpoint {checkpoint_id!r}: only external_weights/<name> checkpoints have download "
                          "URLs, a TTL or a delete here (save_state's weights/... stay until removed from the data dir)")
    return name


@router.get("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}/external_weights_urls")
async def external_weights_urls(run_id: str, checkpoint_id: str, request: Request) -> Response:
    async def h(s: TinkerService, _: dict[str, Any]) -> dict[str, Any]:
        return s.exports.urls(s.models.run_id(run_id), _external(checkpoint_id), str(request.base_url))
    return await _handle(request, h)


@router.put("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}/ttl")
async def set_checkpoint_ttl(run_id: str, checkpoint_id: str, request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        s.exports.set_ttl(s.models.run_id(run_id), _external(checkpoint_id), _int(body, "ttl_seconds"))
        return {}
    return await _handle(request, h)


@router.delete("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}")
async def delete_checkpoint(run_id: str, checkpoint_id: str, request: Request) -> Response:
    async def h(s: TinkerService, _: dict[str, Any]) -> dict[str, Any]:
        s.exports.delete(s.models.run_id(run_id), _external(checkpoint_id))
        return {}
    return await _handle(request, h)


@router.get("/external_weights/{run_id}/{name}/{file}")
async def external_weights_file(run_id: str, name: str, file: str, request: Request) -> Response:
    """A file behind a signed URL (``external_weights_urls``): the signature is the credential, not X-API-Key (the
    cookbook fetches it with urllib)."""
    server: SwarmServer = request.app.state.swarm
    if server.tinker is None:
        return _error(404, "the Tinker API is off on this server")
    try:
        expires = int(request.query_params.get("expires", ""))
    except ValueError:
        return _error(403, "a download URL needs its expires and sig (ask for URLs: external_weights_urls)")
    try:
        path = server.tinker.exports.signed_file(run_id, name, file, expires, request.query_params.get("sig", ""))
    except TinkerError as e:
        return _error(e.status if 400 <= e.status < 500 else 400, e.message)
    return FileResponse(path, media_type="application/octet-stream")


# ---------------------------------------------------------------------------------------------- not served
# SDK calls this server does not serve, each with what to do instead (docs/tinker.md, "Not supported").
NOT_SERVED = {
    "retrieve_futures": "the session-wide future poller is off here (client/config sets sample_use_retrieve_futures "
                        "false): the SDK polls retrieve_future",
    "join_sampling_session": "joining sampling sessions is off here (client/config sets sample_join_sampling_session "
                             "false)",
    "create_custom_loss": "server-side custom losses are not supported: use a built-in loss name "
                          "(docs/tinker.md, \"Losses\") or forward_backward_custom (a client-side loss)",
    "cancel_future": "futures cannot be cancelled here",
    "copy_weights": "copying weights between projects is not supported",
    "training_runs": "listing training runs and their checkpoints (the REST client) is not supported: "
                     "GET training_runs/{id} is",
    "checkpoints": "listing checkpoints (the REST client) is not supported: save_state returns each path",
    "weights_info": "weights_info (the REST client) is not supported",
    "sessions": "listing sessions (the REST client) is not supported",
}


@router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
async def not_served(rest: str, request: Request) -> Response:
    """Any other ``/api/v1`` path: a 404 naming the call (after the key check, as every route)."""
    service = _service(request)
    if isinstance(service, JSONResponse):
        return service
    allowed = sorted({m for r in router.routes if isinstance(r, APIRoute) and r.path_regex.match(request.url.path)
                      and r.endpoint is not not_served for m in (r.methods or ())})
    if allowed:
        return _error(405, f"{request.method} /api/v1/{rest}: this route takes {', '.join(allowed)}")
    why = NOT_SERVED.get(rest.split("/", 1)[0], "this server does not serve it")
    return _error(404, f"{request.method} /api/v1/{rest} is not served by AgentJet's Tinker API: {why} "
                       "(see docs/tinker.md)")
