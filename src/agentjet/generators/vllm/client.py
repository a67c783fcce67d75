"""HTTP client for a vLLM OpenAI-compatible server: token-id completions, prompt scoring and the RL routes
(pause / reload weights / reset prefix cache / resume, the native weight-transfer routes, runtime LoRA). The
control routes need the server started with ``VLLM_SERVER_DEV_MODE=1``.

Errors: a transport failure (refused, reset, timed out) raises :class:`VLLMConnectionError`; a 4xx answer
raises :class:`VLLMRequestError` (the request was wrong); a 5xx answer raises :class:`VLLMServerError`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

TOKEN_ID_PREFIX = "token_id:"


class VLLMError(RuntimeError):
    pass


class VLLMConnectionError(VLLMError):
    """No answer: the process is down, restarting or hung."""


class VLLMRequestError(VLLMError):
    """vLLM rejected the request (HTTP 4xx)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"vLLM answered {status}: {message}")
        self.status = status


class VLLMServerError(VLLMError):
    """vLLM failed on the request (HTTP 5xx)."""


@dataclass
class Completion:
    """One choice of a completion, in token ids."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str = ""
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass
class _StreamState:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None


def _error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500]
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    return str(body)[:500]


def parse_top(entries: list[dict[str, float] | None] | None) -> list[list[tuple[int, float]]]:
    """vLLM's ``top_logprobs`` (with ``return_tokens_as_token_ids``: keys ``token_id:N``) as (id, logprob)
    pairs, best first."""
    out: list[list[tuple[int, float]]] = []
    for entry in entries or []:
        pairs = []
        for key, lp in (entry or {}).items():
            if not key.startswith(TOKEN_ID_PREFIX):
                raise VLLMError(f"top_logprobs key {key!r} is not a token id (return_tokens_as_token_ids off?)")
            pairs.append((int(key[len(TOKEN_ID_PREFIX):]), float(lp)))
        pairs.sort(key=lambda p: -p[1])
        out.append(pairs)
    return out


def parse_choice(choice: dict[str, Any], top_k: int) -> Completion:
    ids = choice.get("token_ids")
    if ids is None:
        raise VLLMError("the completion has no token_ids: is this vLLM >= 0.10 with return_token_ids?")
    lp = (choice.get("logprobs") or {}).get("token_logprobs")
    if lp is None or len(lp) != len(ids):
        raise VLLMError(f"expected {len(ids)} token logprobs, got {None if lp is None else len(lp)}")
    top = parse_top((choice.get("logprobs") or {}).get("top_logprobs")) if top_k else None
    if top is not None:
        top = [pairs[:top_k] for pairs in top]
    return Completion(token_ids=[int(t) for t in ids], logprobs=[float(x) for x in lp],
                      finish_reason=str(choice.get("finish_reason") or "length"), text=choice.get("text") or "",
                      top_logprobs=top)


class VLLMClient:
    """Talks to one vLLM server. Safe to use from several event loops (one connection pool per loop)."""

    def __init__(self, base_url: str, *, request_timeout_s: float = 600.0, control_timeout_s: float = 120.0,
                 max_connections: int = 256) -> None:
        self.base_url = base_url.rstrip("/")
        self.request_timeout_s = request_timeout_s
        self.control_timeout_s = control_timeout_s
        self.max_connections = max_connections
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            for old in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[old]
            limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=64)
            client = httpx.AsyncClient(base_url=self.base_url, limits=limits, timeout=self.request_timeout_s)
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    async def _post(self, path: str, *, json_body: Any = None, params: dict[str, str] | None = None,
                    timeout: float | None = None) -> Any:
        try:
            resp = await self._http().post(path, json=json_body, params=params,
                                           timeout=timeout or self.control_timeout_s)
        except httpx.TransportError as exc:
            raise VLLMConnectionError(f"POST {path}: {type(exc).__name__}: {exc}") from exc
        return self._decode(path, resp)

    async def _get(self, path: str, *, params: dict[str, str] | None = None) -> Any:
        try:
            resp = await self._http().get(path, params=params, timeout=self.control_timeout_s)
        except httpx.TransportError as exc:
            raise VLLMConnectionError(f"GET {path}: {type(exc).__name__}: {exc}") from exc
        return self._decode(path, resp)

    @staticmethod
    def _decode(path: str, resp: httpx.Response) -> Any:
        if 400 <= resp.status_code < 500:
            raise VLLMRequestError(resp.status_code, _error_message(resp))
        if resp.status_code >= 500:
            raise VLLMServerError(f"{path}: vLLM answered {resp.status_code}: {_error_message(resp)}")
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            return resp.text

    # ------------------------------------------------------------------ generation
    async def complete(self, body: dict[str, Any], top_k: int = 0) -> Completion:
        """POST /v1/completions (not streamed); ``body`` must ask for token ids and logprobs."""
        data = await self._post("/v1/completions", json_body=body, timeout=self.request_timeout_s)
        try:
            return parse_choice(data["choices"][0], top_k)
        except (KeyError, IndexError, TypeError) as exc:
            raise VLLMError(f"unexpected completion body: {str(data)[:300]}") from exc

    async def stream(self, body: dict[str, Any], top_k: int = 0) -> AsyncIterator[tuple[list[int], list[float]]
                                                                                   | Completion]:
        """Streamed /v1/completions: yields (new ids, their logprobs) per chunk, then the whole Completion."""
        state = _StreamState()
        try:
            async with self._http().stream("POST", "/v1/completions", json={**body, "stream": True},
                                           timeout=self.request_timeout_s) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    self._decode("/v1/completions", resp)
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    chunk = json.loads(payload)
                    if "error" in chunk:
                        raise VLLMServerError(f"vLLM stream error: {_error_message_obj(chunk)}")
                    for choice in chunk.get("choices", []):
                        part = parse_choice(choice, top_k) if choice.get("token_ids") else None
                        state.text += choice.get("text") or ""
                        if choice.get("finish_reason"):
                            state.finish_reason = choice["finish_reason"]
                        if part is None or not part.token_ids:
                            continue
                        state.token_ids += part.token_ids
                        state.logprobs += part.logprobs
                        if part.top_logprobs:
                            state.top += part.top_logprobs
                        yield part.token_ids, part.logprobs
        except httpx.TransportError as exc:
            raise VLLMConnectionError(f"stream /v1/completions: {type(exc).__name__}: {exc}") from exc
        if state.finish_reason is None:
            raise VLLMConnectionError("the completion stream ended without a finish reason")
        yield Completion(state.token_ids, state.logprobs, state.finish_reason, state.text,
                         state.top if top_k else None)

    async def prompt_logprobs(self, model: str, prompt_ids: list[int], temperature: float = 1.0) -> list[float]:
        """Logprob of each prompt token given its prefix (positions 1..n-1)."""
        body = {"model": model, "prompt": prompt_ids, "max_tokens": 1, "prompt_logprobs": 0,
                "temperature": temperature, "return_token_ids": True}
        data = await self._post("/v1/completions", json_body=body, timeout=self.request_timeout_s)
        rows = data["choices"][0].get("prompt_logprobs")
        if rows is None or len(rows) != len(prompt_ids):
            raise VLLMError(f"expected {len(prompt_ids)} prompt_logprobs rows, got {None if rows is None else len(rows)}")
        out = []
        for pos in range(1, len(prompt_ids)):
            entry = (rows[pos] or {}).get(str(prompt_ids[pos]))
            if entry is None:
                raise VLLMError(f"prompt_logprobs has no entry for token {prompt_ids[pos]} at position {pos}")
            out.append(float(entry["logprob"] if isinstance(entry, dict) else entry))
        return out

    # ------------------------------------------------------------------ weight sync (dev routes)
    async def pause(self, mode: str = "keep") -> None:
        await self._post("/pause", params={"mode": mode})

    async def resume(self) -> None:
        await self._post("/resume")

    async def reload_weights(self, path: str) -> None:
        await self._post("/collective_rpc", json_body={"method": "reload_weights", "kwargs": {"weights_path": path}})

    async def reset_prefix_cache(self, reset_running_requests: bool = True) -> bool:
        """True when the cache was emptied. With requests frozen by ``pause(mode="keep")`` their blocks are
        held, so ``reset_running_requests`` preempts them: they recompute their KV with the new weights."""
        data = await self._post("/reset_prefix_cache",
                                params={"reset_running_requests": str(reset_running_requests).lower()})
        return bool(data.get("success", True)) if isinstance(data, dict) else True

    # ------------------------------------------------------------------ native weight transfer (vLLM >= 0.16)
    # The routes of vllm/entrypoints/rl/online/api_router.py (vLLM 0.32); they answer 500 unless vLLM was started
    # with --weight-transfer-config. One round: start_weight_update -> update_weights (blocks while the trainer
    # broadcasts) -> finish_weight_update. See docs/vllm.md, "NCCL weight transfer".
    async def world_size(self, include_dp: bool = True) -> int:
        """vLLM's workers (TP x PP, times DP with ``include_dp``): the NCCL group is these plus the trainer."""
        data = await self._get("/get_world_size", params={"include_dp": str(include_dp).lower()})
        try:
            return int(data["world_size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise VLLMError(f"unexpected /get_world_size body: {str(data)[:300]}") from exc

    async def init_weight_transfer_engine(self, init_info: dict[str, Any], timeout: float | None = None) -> None:
        """Join vLLM's workers to the trainer's group; returns once the rendezvous is done (the trainer must be
        joining at the same time), so ``timeout`` bounds the rendezvous."""
        await self._post("/init_weight_transfer_engine", json_body={"init_info": init_info}, timeout=timeout)

    async def start_weight_update(self) -> None:
        await self._post("/start_weight_update")

    async def update_weights(self, update_info: dict[str, Any], timeout: float | None = None) -> None:
        """Announce the tensors (``names``, ``dtype_names``, ``shapes``, in send order); returns once the workers
        have received and loaded them, so it must run while the trainer sends, and ``timeout`` bounds the
        transfer."""
        await self._post("/update_weights", json_body={"update_info": update_info}, timeout=timeout)

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Finalize the round (layerwise post-processing) and record ``weight_version`` (``GET /weight_info``)."""
        body = {"weight_version": weight_version} if weight_version is not None else None
        await self._post("/finish_weight_update", json_body=body)

    async def shutdown_weight_transfer_engine(self) -> None:
        """Release the trainer's group on vLLM's side (refused while a round is open)."""
        await self._post("/shutdown_weight_transfer_engine")

    async def weight_version(self) -> str | None:
        data = await self._get("/weight_info")
        return data.get("weight_version") if isinstance(data, dict) else None

    # ------------------------------------------------------------------ LoRA
    async def load_lora(self, name: str, path: str) -> None:
        await self._post("/v1/load_lora_adapter", json_body={"lora_name": name, "lora_path": path})

    async def unload_lora(self, name: str) -> None:
        await self._post("/v1/unload_lora_adapter", json_body={"lora_name": name})


def _error_message_obj(body: dict[str, Any]) -> str:
    err = body.get("error")
    return str(err.get("message") if isinstance(err, dict) else err)
