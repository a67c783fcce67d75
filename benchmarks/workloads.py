"""What the engine benchmarks share: model shapes built from a config (no hub download), the request sets, a
closed-loop driver, and the record of where a run happened (machine, device, commit).

Imported by ``benchmarks/serving/engine.py`` and ``benchmarks/serving/server_throughput.py`` (run them from the repository
root or anywhere: they put this directory on ``sys.path``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import platform
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentjet.runtime.provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# where the random-weight models (``135m``, ``1.7b``) are built once
MODEL_ROOT = Path(os.environ.get("AGENTJET_BENCH_MODELS", Path(tempfile.gettempdir()) / "agentjet-bench-models"))

# Model shapes built from a config with random weights: SmolLM2's published shapes, no download.
SHAPES: dict[str, dict[str, Any]] = {
    "135m": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
             "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192,
             "rope_theta": 100000.0, "tie_word_embeddings": True, "rms_norm_eps": 1e-5},
    "1.7b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24, "num_attention_heads": 32,
             "num_key_value_heads": 32, "vocab_size": 49152, "max_position_embeddings": 8192,
             "rope_theta": 130000.0, "tie_word_embeddings": True, "rms_norm_eps": 1e-5},
}


def smollm2_tokenizer_dir() -> Path:
    """SmolLM2's tokenizer: ``$AGENTJET_SMOLLM2_TOKENIZER`` (a folder, e.g. the GPU kit's
    ``.gpu/smollm2-tokenizer`` from scripts/gpu_prepare.sh), else the installed SmolLM2 package."""
    env = os.environ.get("AGENTJET_SMOLLM2_TOKENIZER")
    if env:
        return Path(env)
    from agentjet.models import resolve_model

    return resolve_model("smollm2-135m-instruct")


def random_model_dir(shape: str, dtype: torch.dtype, root: Path, seed: int = 0) -> Path:
    """A local Hugging Face directory with SmolLM2 shapes ``shape``, random weights and SmolLM2's tokenizer
    (nothing is downloaded). Built once per (shape, dtype) under ``root``."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = root / f"smollm2-{shape}-random-{str(dtype).removeprefix('torch.')}"
    if (out / "config.json").exists():
        return out
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    config = LlamaConfig(**SHAPES[shape], bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    with torch.device("cpu"):
        model = LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def model_path(name: str, dtype: torch.dtype, root: Path) -> Path:
    """``135m`` / ``1.7b``: random weights with SmolLM2 shapes; anything else: ``agentjet.models.resolve_model``."""
    if name in SHAPES:
        return random_model_dir(name, dtype, root)
    from agentjet.models import resolve_model

    return resolve_model(name)


def parameter_count(name_or_path: Path) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(name_or_path))
    return sum(p.numel() for p in model.parameters())


@dataclass(frozen=True)
class Req:
    prompt_ids: list[int]
    max_tokens: int
    seed: int


def make_requests(vocab: int, special: set[int], n: int, prompt_tokens: int, new_tokens: int | tuple[int, int],
                  seed: int) -> list[Req]:
    """``n`` requests with random ``prompt_tokens``-token prompts (no special tokens) and ``new_tokens`` new
    tokens each (an int: fixed; a pair: uniform in that range)."""
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        prompt = []
        while len(prompt) < prompt_tokens:
            t = rng.randrange(vocab)
            if t not in special:
                prompt.append(t)
        k = new_tokens if isinstance(new_tokens, int) else rng.randint(*new_tokens)
        reqs.append(Req(prompt, k, seed * 100_000 + i))
    return reqs


async def closed_loop(submit: Callable[[Req], Awaitable[int]], reqs: list[Req], concurrency: int) -> tuple[int, float]:
    """``concurrency`` clients, each sending its next request when its previous one returns, until the list is
    done. Returns (generated tokens, wall seconds)."""
    queue = list(reversed(reqs))
    total = 0

    async def client() -> None:
        nonlocal total
        while queue:
            n = await submit(queue.pop())  # (``total += await ...`` would read total before awaiting)
            total += n

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return total, time.perf_counter() - t0


def machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "commit": git_commit(ROOT),
                            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                            "platform": platform.platform(), "torch": torch.__version__,
                            "device": str(device), "load_average": os.getloadavg()}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    else:
        info["device_name"] = _cpu_name()
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


# Dense bf16 peak of the card, for MFU (NVIDIA data sheets, SXM parts).
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
