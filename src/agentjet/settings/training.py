"""The training loop's settings (``training``: GRPO groups, batches, staleness and admission, task ratios,
checkpoints) and how recorded calls become training samples (``tracking``). prime-rl's counterpart is its
orchestrator config."""

from __future__ import annotations

import enum
import math
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from agentjet.settings.section import LIVE, Section, parse_mapping
from agentjet.tracking import TrackingConfig


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


class TrainingSettings(Section):
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
    task_ratios: Annotated[dict[str, float], BeforeValidator(parse_mapping)] = Field(
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


class TrackingSettings(Section):
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
