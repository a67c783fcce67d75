"""Server settings. Everything a user may tune lives here, validated by pydantic."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentjet.algorithms import AdvantageEstimator
from agentjet.engines.vllm.settings import VLLMSettings
from agentjet.server.quotas import AbsentPolicy, validate_ratios
from agentjet.tracking import TrackingConfig


class SamplingDefaults(BaseModel):
    """Used when a chat request leaves a parameter out."""

    model_config = ConfigDict(extra="forbid")
    temperature: float = Field(1.0, ge=0, le=5)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(256, ge=1)


class TrainingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    group_size: int = Field(4, ge=1, le=1024, description="episodes per GRPO group (same task id)")
    batch_groups: int = Field(2, ge=1, le=1024, description="groups per train step")
    min_group_size: int = Field(2, ge=1, description="an incomplete group is used after group_timeout_s if this big")
    group_timeout_s: float = Field(120.0, gt=0)
    drop_uniform_groups: bool = Field(True, description="skip groups whose rewards are all equal (zero advantage)")
    estimator: AdvantageEstimator = AdvantageEstimator.GRPO
    max_staleness: int = Field(4, ge=0, description="max policy versions between generation and training")
    learning_rate: float = Field(1e-5, gt=0, lt=1)
    checkpoint_every: int = Field(10, ge=0, description="train steps between checkpoints (0: only on stop)")
    keep_checkpoints: int = Field(2, ge=1)
    task_ratios: dict[str, float] = Field(default_factory=dict, description="share of each batch per task type "
                                          "(cocktail training); empty: no quotas")
    absent_policy: AbsentPolicy = Field(AbsentPolicy.FILL, description="strict: wait for every type; fill: "
                                        "others fill an absent type's share")
    absent_after_s: float = Field(30.0, gt=0, description="a type with no begin for this long counts as absent")

    @field_validator("task_ratios")
    @classmethod
    def _ratios(cls, v: dict[str, float]) -> dict[str, float]:
        return validate_ratios(v)


class TrackingSettings(BaseModel):
    """Context tracking (see docs/timeline_merging.md)."""

    model_config = ConfigDict(extra="forbid")
    merge: bool = Field(True, description="merge calls whose context extends an earlier call into one sample")
    compare_level: Literal["token", "text"] = "token"
    ignore_tools: bool = Field(True, description="a changed tool list does not block a merge")
    fix_drift: bool = Field(True, description="splice the exact generated ids back over re-tokenized replies")
    tito: bool = Field(True, description="token-in, token-out at request time: prompts that resend this agent's "
                       "earlier replies hold the ids it generated, not their re-tokenization")
    weighting: Literal["per_episode", "none", "per_sample"] = "per_episode"

    def to_config(self) -> TrackingConfig:
        return TrackingConfig(**self.model_dump(exclude={"tito"}))


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = "smollm2-135m-instruct"
    served_model_name: str | None = None  # the name /v1/models reports (default: model)
    host: str = "127.0.0.1"
    port: int = Field(10086, ge=0, le=65535)
    public_url: str | None = None  # what clients should use as base_url (default http://host:port)
    data_dir: Path = Path("runs/server")
    swarm_token: str | None = None  # gates join and begin
    admin_token: str | None = None  # gates control and other clients' traces
    lease_seconds: float = Field(60.0, gt=0)
    max_batch_size: int = Field(8, ge=1)
    max_context: int | None = None
    sampling: SamplingDefaults = Field(default_factory=SamplingDefaults)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    tracking: TrackingSettings = Field(default_factory=TrackingSettings)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    max_messages: int = Field(2048, ge=1)
    max_open_episodes_per_client: int = Field(1024, ge=1)
    # --engine vllm (issue 13): generation on a managed vLLM subprocess; None = the embedded engine
    vllm: VLLMSettings | None = Field(None, description="set to roll out on vLLM (see docs/vllm.md)")

    @property
    def name(self) -> str:
        return self.served_model_name or self.model

    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/") + "/v1"
