"""What our vLLM adapter costs: the same concurrent requests sent to the vLLM it manages as a minimal
``/v1/completions`` body, with logprobs and token ids, with the adapter's full body, and through
``VLLMGenerator.generate``; the adapter both as it runs by default (``pause_mode="keep"``: streamed from vLLM so
that each token carries the policy version it was sampled under, see ``engines/vllm/engine.py``) and unstreamed
(what ``pause_mode="wait"`` or LoRA do). Prints one line per concurrency (median of 2 rounds, tok/s).

    flock /tmp/aj-cpu.lock .venv/bin/python benchmarks/vllm_request_cost.py     # needs make setup-vllm, ~4 min
"""
import asyncio
import statistics
import time
from pathlib import Path

import httpx

from agentjet.engines.base import SamplingParams
from agentjet.layouts import vllm_engine
from agentjet.settings import EngineSettings, ServerConfig, VLLMSettings

ROOT = Path(__file__).resolve().parents[1]
_settings = VLLMSettings(python=ROOT / ".venv-vllm/bin/python", kv_cache_gib=2.0)
eng = vllm_engine(ServerConfig(model="smollm2-135m-instruct", data_dir=ROOT / "runs" / "vprobe",
                               engine=EngineSettings(kind="vllm", vllm=_settings)), ROOT / "runs" / "vprobe").generator
tok = eng.tokenizer
ids = list(tok.apply_chat_template([{"role": "user", "content": "Write a long poem about the ocean at night."}], add_generation_prompt=True, tokenize=True, return_dict=False))
N_TOK = 64
def bodies(kind, n):
    out = []
    for _ in range(n):
        if kind == "minimal":
            b = {"model": eng._served_name(), "prompt": ids, "max_tokens": N_TOK, "temperature": 1.0, "ignore_eos": True}
        elif kind == "logprobs":
            b = {"model": eng._served_name(), "prompt": ids, "max_tokens": N_TOK, "temperature": 1.0, "ignore_eos": True, "logprobs": 1, "return_token_ids": True, "return_tokens_as_token_ids": True}
        else:
            b = eng.request_body(ids, SamplingParams(temperature=1.0, max_tokens=N_TOK), eng._served_name())
            b["stop_token_ids"] = []
        out.append(b)
    return out
async def raw(kind, n):
    async with httpx.AsyncClient(base_url=eng.url, timeout=600) as c:
        t0 = time.perf_counter()
        rs = await asyncio.gather(*(c.post("/v1/completions", json=b) for b in bodies(kind, n)))
        dt = time.perf_counter() - t0
    toks = sum(r.json()["usage"]["completion_tokens"] for r in rs)
    return toks / dt
async def ours(n, per_token_versions=True):
    eng._stop_ids = set()
    type(eng).records_token_versions = property(lambda self: per_token_versions)  # engine.vllm.token_versions, one engine
    t0 = time.perf_counter()
    rs = await asyncio.gather(*(eng.generate(ids, SamplingParams(temperature=1.0, max_tokens=N_TOK)) for _ in range(n)))
    return sum(len(r.token_ids) for r in rs) / (time.perf_counter() - t0)
async def main():
    await raw("minimal", 8)
    for n in (1, 8, 32):
        res = {k: [] for k in ("minimal", "logprobs", "full-body", "adapter", "adapter-unstreamed")}
        for _ in range(2):
            for k in ("minimal", "logprobs", "full-body"):
                res[k].append(await raw(k, n))
            res["adapter"].append(await ours(n))
            res["adapter-unstreamed"].append(await ours(n, per_token_versions=False))
        print(f"c={n}: " + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in res.items()), flush=True)
try:
    asyncio.run(main())
finally:
    eng.close_sync()
