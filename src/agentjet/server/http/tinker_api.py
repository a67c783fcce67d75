"""The Tinker training API (``/api/v1``) for the official ``tinker`` SDK (issue 35; see ``docs/tinker.md``).

Served only when the server has a ``--tinker-key``; otherwise every ``/api/v1`` path answers 404 naming the flag.
Auth is the SDK's ``X-API-Key`` header: a wrong or missing key is a 401 (never 408/409/429/5xx, which the SDK
retries for minutes). Bad input is a 4xx, or a failed future with an error and a category; never a 5xx."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from agentjet.server.swarm import SwarmServer
from agentjet.server.tinker import TinkerError, TinkerService

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api/v1", include_in_schema=False)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "detail": message}, status_code=status)


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
        return {"supported_models": [{"model_name": s.served_name, "max_context_length": s.max_context,
                                      "trainable": s.adapters is not None, "sampleable": True}]}
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
    async def h(_: TinkerService, __: dict[str, Any]) -> dict[str, Any]:
        return {"status": "accepted"}  # accepted and dropped
    return await _handle(request, h)


# ---------------------------------------------------------------------------------------------- models
@router.post("/create_model")
async def create_model(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        session_id, base_model = _str(body, "session_id"), _str(body, "base_model")
        s.session(session_id)
        lora = body.get("lora_config")
        if lora is not None and not isinstance(lora, dict):
            raise TinkerError("lora_config must be an object")
        rank = _int(lora, "rank") if lora is not None else None
        flags = {k: bool(lora.get(k, True)) for k in ("train_mlp", "train_attn", "train_unembed")} if lora else {}

        async def work() -> dict[str, Any]:
            model = await s.create_model(session_id, base_model, rank, flags)
            return {"type": "create_model", "model_id": model.model_id}

        return {"request_id": s.submit(None, work)}
    return await _handle(request, h)


@router.post("/get_info")
async def get_info(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        m = s.model(_str(body, "model_id"))
        return {"type": "get_info", "model_id": m.model_id, "lora_rank": m.rank, "is_lora": True,
                "model_data": {"arch": "causal_lm", "model_name": s.served_name, "tokenizer_id": s.model_path}}
    return await _handle(request, h)


# ---------------------------------------------------------------------------------------------- futures
@router.post("/retrieve_future")
async def retrieve_future(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> Any:
        rid = _str(body, "request_id")
        fut = await s.retrieve(rid)
        if fut is None:
            return {"type": "try_again", "request_id": rid, "queue_state": "active"}
        s.forget(rid)
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
        model = service.model(req.model_id)
    except TinkerError as e:
        return _error(e.status if 400 <= e.status < 500 else 400, e.message)

    async def work() -> bytes:
        result = await service.forward_backward(model, req.data, req.loss_fn, req.config, not req.forward_only)
        return encode_forward_backward(result)

    return JSONResponse({"request_id": service.submit(model.model_id, work, req.seq_id), "model_id": model.model_id})


@router.post("/optim_step")
async def optim_step(request: Request) -> Response:
    async def h(s: TinkerService, body: dict[str, Any]) -> dict[str, Any]:
        model = s.model(_str(body, "model_id"))
        adam = body.get("adam_params", body.get("optim_params", {}))
        if not isinstance(adam, dict):
            raise TinkerError("adam_params must be an object")
        if adam.get("type", "adam") != "adam":
            raise TinkerError(f"optimizer {adam.get('type')!r} is not supported: Adam only")
        seq_id = _int(body, "seq_id")

        async def work() -> dict[str, Any]:
            return await s.optim_step(model, adam)

        return {"request_id": s.submit(model.model_id, work, seq_id), "model_id": model.model_id}
    return await _handle(request, h)
