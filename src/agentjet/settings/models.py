"""Every setting of a swarm server, declared once: type, default, bounds and description.

``ServerConfig`` is the single source. The CLI (``ajet server --help``), config files, ``AGENTJET_*``
environment variables, ``ajet up`` and ``ajet ctl set`` are all generated from or validated through these
models (``agentjet.settings.fields`` walks them; ``agentjet.settings.load`` merges the sources).

Sections marked live in ``LIVE_SECTIONS`` may be changed while the server runs (``ajet ctl set``); the
others need a restart.
"""

from __future__ import annotations

import enum
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

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
from agentjet.tracking import TrackingConfig

LIVE_SECTIONS = ("training", "sampling", "loss")


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


CommaList = Annotated[list[str], BeforeValidator(_split_list)]


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

    temperature: float = Field(1.0, ge=0, le=2, description="default sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="default nucleus (top-p) mass")
    max_tokens: int = Field(256, ge=1, le=1_000_000, description="default max new tokens per reply")


class TrainingSettings(_Section):
    """Batching and the training loop (live: takes effect from the next batch)."""

    group_size: int = Field(4, ge=1, le=1024, description="episodes per GRPO group (same task id)")
    batch_groups: int = Field(2, ge=1, le=1024, description="groups per train step")
    min_group_size: int = Field(2, ge=1, le=1024, description="an incomplete group is trained after "
                                "group_timeout_s if it has at least this many episodes")
    group_timeout_s: float = Field(120.0, gt=0, le=86_400, description="how long an incomplete group waits")
    drop_uniform_groups: bool = Field(True, description="skip groups whose rewards are all equal (no signal)")
    max_staleness: int = Field(4, ge=0, le=1000, description="max policy versions between generation and "
                               "training; older episodes are dropped and counted")
    learning_rate: float = Field(1e-5, gt=0, lt=1, description="AdamW learning rate",
                                 json_schema_extra={"aliases": ["lr"]})
    checkpoint_every: int = Field(10, ge=0, le=1_000_000, description="train steps between checkpoints "
                                  "(0: only on stop)")
    keep_checkpoints: int = Field(2, ge=1, le=1000, description="checkpoints kept on disk")
    task_ratios: Annotated[dict[str, float], BeforeValidator(_parse_mapping)] = Field(
        default_factory=dict, description="cocktail training: share of each batch per task type, e.g. "
        "math=0.7,code=0.3 (empty: no quotas)")
    absent_policy: AbsentPolicy = Field(AbsentPolicy.FILL, description="strict: wait for every type's share; "
                                        "fill: others fill an absent type's share")
    absent_after_s: float = Field(30.0, gt=0, le=86_400, description="a task type with no begin for this long "
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
    """The policy-gradient loss (live)."""

    estimator: AdvantageEstimator = Field(AdvantageEstimator.GRPO, description="advantage estimator")
    clip_eps_low: float = Field(0.2, ge=0, le=1, description="PPO clip: lower epsilon of the importance ratio")
    clip_eps_high: float = Field(0.28, ge=0, le=10, description="PPO clip: upper epsilon of the importance ratio")
    kl_coef: float = Field(0.0, ge=0, le=100, description="k3 KL penalty to a frozen copy of the initial "
                           "weights (0: off, no reference model kept)")


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


class LoraSettings(_Section):
    """LoRA adapters (rank 0: full fine-tuning)."""

    rank: int = Field(0, ge=0, le=1024, description="LoRA rank (0: train every weight)")
    alpha: float = Field(32.0, gt=0, le=4096, description="LoRA alpha (scale = alpha / rank)")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout")
    targets: CommaList = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj"],
        min_length=1, description="module names that get adapters (comma-separated)")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


class EngineKind(enum.StrEnum):
    HF = "hf"  # the embedded transformers engine (CPU or one CUDA device)
    NULL = "null"  # canned replies and no-op training (benchmarks, protocol tests)


class EngineSettings(_Section):
    """The engine that owns the weights: where it runs, how it batches, how it trains (restart to change)."""

    kind: EngineKind = Field(EngineKind.HF, description="hf (the embedded engine) or null (canned replies)",
                             json_schema_extra={"flag": "engine"})
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="auto (CUDA when present), "
                        "cpu, cuda or cuda:N")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="weight dtype (auto: bfloat16 on CUDA, float32 on CPU)")
    autocast_bf16: bool = Field(False, description="train the forward pass under bfloat16 autocast")
    max_batch_size: int = Field(8, ge=1, le=4096, description="max concurrent generations batched together")
    batch_wait_ms: float = Field(5.0, ge=0, le=10_000, description="how long an idle engine waits for more "
                                 "requests before it starts a batch")
    batching: Literal["continuous", "static"] = Field(
        "continuous", description="continuous: a finished request frees its slot at once and a queued one joins "
        "at the next decode step; static: a batch runs until its longest request ends (the earlier engine)")
    kv_cache_tokens: int = Field(512, ge=16, le=10_000_000, description="KV cache columns per slot, allocated "
                                 "up front (continuous batching); doubled, up to max_context, when a request "
                                 "needs more")
    cuda_graphs: bool = Field(True, description="replay the decode step from captured CUDA graphs (CUDA only)")
    compile: bool = Field(False, description="torch.compile the decode step (continuous batching)")
    max_context: int | None = Field(None, ge=2, le=10_000_000, description="cap on prompt + reply tokens "
                                    "(default: the model's own limit)")
    gradient_checkpointing: bool = Field(False, description="recompute decoder activations in backward "
                                         "(less memory, more time)")
    micro_batch_tokens: int = Field(4096, ge=16, le=10_000_000, description="padded tokens per "
                                    "forward/backward micro-batch")
    logprob_chunk_tokens: int = Field(1024, ge=1, le=10_000_000, description="rows of the vocabulary "
                                      "projection computed at once in training")
    weight_decay: float = Field(0.0, ge=0, le=10, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, le=1e6, description="gradient clipping norm")
    seed: int = Field(0, ge=0, lt=2**63, description="seed of the engine's own random draws")
    null_reply: str = Field("The answer is 7.", max_length=10_000, description="the null engine's canned reply")
    lora: LoraSettings = Field(default_factory=LoraSettings)


_NAME_RE = re.compile(r"[^A-Za-z0-9_.-]+")


class ServerConfig(_Section):
    """A swarm server: one trainable model behind an OpenAI-compatible API."""

    model: str = Field("smollm2-135m-instruct", min_length=1, description="model name or local HF directory")
    served_model_name: str | None = Field(None, min_length=1, max_length=200, description="the name /v1/models "
                                          "reports (default: model)")
    host: str = Field("127.0.0.1", min_length=1, description="bind address (loopback by default)")
    port: int = Field(10086, ge=0, le=65535, description="listen port")
    public_url: str | None = Field(None, description="base URL clients should use, if not http://host:port")
    data_dir: Path | None = Field(None, description="store and checkpoints (default: "
                                  "$AGENTJET_HOME/runs/<served name>)")
    resume: bool = Field(False, description="continue from the latest checkpoint and the unconsumed samples")
    swarm_token: SecretStr | None = Field(None, description="gates join, begin and status (open when unset)")
    admin_token: SecretStr | None = Field(None, description="gates control and other episodes' traces "
                                          "(generated, and written to the data dir, when not given)")
    allow_insecure: bool = Field(False, description="allow a non-loopback bind without both tokens")
    lease_seconds: float = Field(60.0, gt=0, le=86_400, description="an episode with no call or heartbeat for "
                                 "this long expires")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=2**31, description="largest request body accepted")
    max_messages: int = Field(2048, ge=1, le=1_000_000, description="most messages per chat request")
    max_open_episodes_per_client: int = Field(1024, ge=1, le=10_000_000, description="open episodes one client "
                                              "may hold")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="server log level")
    engine: EngineSettings = Field(default_factory=EngineSettings)
    sampling: SamplingDefaults = Field(default_factory=SamplingDefaults)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    loss: LossSettings = Field(default_factory=LossSettings)
    tracking: TrackingSettings = Field(default_factory=TrackingSettings)

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
        return self.model_dump(mode="json", exclude={"swarm_token", "admin_token"})

    @staticmethod
    def secret(value: SecretStr | None) -> str | None:
        return value.get_secret_value() if value is not None else None
