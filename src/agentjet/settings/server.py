"""The server's own settings and the whole (``ServerConfig``): the model it serves, its HTTP edge, tokens and
limits, the dashboard and metrics (``observe``), and one section per role: ``generator`` and ``sampling``
(``generator.py``), ``learner`` and ``loss`` (``learner.py``), ``placement`` (``placement.py``), ``training`` and
``tracking`` (``training.py``). The rules across sections are here; prime-rl's counterpart is its rl config,
which composes the roles' configs.

``ServerConfig`` is the single source. The CLI (``ajet server --help``), config files, ``AGENTJET_*`` environment
variables, ``ajet up`` and ``ajet ctl set`` are all generated from or validated through it
(``agentjet.settings.fields`` walks it; ``agentjet.settings.load`` merges the sources). A setting marked live
(``json_schema_extra=LIVE``) may be changed while the server runs (``ajet ctl set``); the others need a restart.
Names that moved are in ``agentjet.settings.moved``: each old one is refused with its new name. No validator
rewrites a setting: a value derived from several (the swarm's adapters with a Tinker key, ``swarm_adapters``) is
computed by a method that the code needing it calls."""

from __future__ import annotations

import enum
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SecretStr, field_validator, model_validator

from agentjet.models import BUILTIN_MODELS, DEFAULT_MODEL
from agentjet.settings.generator import EngineKind, GeneratorSettings, SamplingDefaults
from agentjet.settings.learner import LearnerSettings, LossSettings
from agentjet.settings.moved import refuse_moved
from agentjet.settings.placement import PlacementSettings
from agentjet.settings.section import Section, split_list
from agentjet.settings.training import TrackingSettings, TrainingSettings


class ToolParserKind(enum.StrEnum):
    """How tool calls are read from a reply (``agentjet.server.episodes.tool_parsers``)."""

    AUTO = "auto"  # from the chat template
    HERMES = "hermes"  # <tool_call>{...}</tool_call> (Qwen2.5, Qwen3, SmolLM2)
    LLAMA3_JSON = "llama3_json"  # {"name": ..., "parameters": {...}} (Llama 3.x)
    MISTRAL = "mistral"  # [TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}]


class LogSink(enum.StrEnum):
    """Optional metric sinks next to the JSONL file (which is always written)."""

    TENSORBOARD = "tensorboard"  # needs the `tracking` extra (tensorboard)
    WANDB = "wandb"  # needs the `tracking` extra (wandb)


class ObserveSettings(Section):
    """The dashboard, metrics export and the bench history page (restart to change)."""

    read_token: SecretStr | None = Field(None, description="read-only access to the dashboard and /metrics (the "
                                         "admin token works too); never accepted in a URL")
    log_to: Annotated[list[LogSink], BeforeValidator(split_list)] = Field(
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


class ServerConfig(Section):
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
                                         "tinker SDK with this key (X-API-Key; it starts with tml-); off when unset. "
                                         "With learner.lora.rank and no learner.lora.adapters, the swarm's policy is "
                                         "then served as the one adapter 'policy' (docs/tinker.md)")
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
        refuse_moved(data)
        return data

    @model_validator(mode="after")
    def _learner_group_trains_full_weights(self) -> ServerConfig:
        group, lora = self.learner.group, self.learner.lora
        if lora.adapters and group.procs:
            raise ValueError(f"adapters ({','.join(lora.adapters)}) need the in-process learner, which holds the one "
                             "base they share: learner.group.procs 0 (several adapters on a trainer group are not "
                             "built yet)")
        if self.swarm_adapters() and self.training.task_ratios:
            raise ValueError("training.task_ratios (cocktail quotas) with several adapters is not built yet: use one "
                             "or the other")
        if group.procs and lora.enabled:
            raise ValueError(f"learner.group.procs ({group.procs}) trains the full weights with FSDP2: it cannot "
                             "train LoRA adapters (learner.lora.rank 0, or learner.group.procs 0)")
        self._engine_process_fits()
        if self.generator.kind is EngineKind.VLLM and self.generator.vllm.weight_transfer == "nccl":
            if group.procs:
                raise ValueError("generator.vllm.weight_transfer nccl sends from the in-process learner; from a "
                                 "learner group's rank 0 it is not built yet: use reload with learner.group.procs")
            if lora.enabled:
                raise ValueError("generator.vllm.weight_transfer nccl sends full weights; LoRA adapters go by "
                                 "reload")
        return self

    def _engine_process_fits(self) -> None:
        """``generator.engine_process on`` is refused where the engine runs in process only (``auto`` picks it)."""
        gen = self.generator
        if gen.engine_process != "on":
            return
        if gen.kind is not EngineKind.HF:
            raise ValueError(f"generator.engine_process on runs the embedded generator in a process of its own; "
                             f"generator.kind is {gen.kind.value} (use auto or off)")
        if gen.batching == "static":
            raise ValueError("generator.engine_process on serves continuous batching; static batching runs in "
                             "process (--engine-process off, or --batching continuous)")
        if self.swarm_adapters():
            raise ValueError(f"generator.engine_process on: LoRA adapters {self.swarm_adapters()} (and Tinker clients) "
                             "train in place on the generator's own module, so they keep the in-process engine "
                             "(--engine-process auto or off)")

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

    def _tinker_hosts_the_policy(self) -> bool:
        """``--tinker-key`` with ``--lora-rank N``, no ``--adapters``, the embedded generator and the in-process
        learner: the swarm's policy is served as the one adapter ``policy``, so that Tinker training clients can be
        adapters beside it on the same base (docs/tinker.md)."""
        lora = self.learner.lora
        return (self.tinker_key is not None and lora.enabled and not lora.adapters and not self.learner.group.procs
                and self.generator.kind is EngineKind.HF)

    def swarm_adapters(self) -> list[str]:
        """The swarm's LoRA adapters, one training lane each: ``learner.lora.adapters``, or ``[policy]`` when a Tinker
        key asks for it (``_tinker_hosts_the_policy``); empty: one policy, no adapters. The settings keep what was
        given; the layout and the server read this."""
        return [TINKER_SWARM_ADAPTER] if self._tinker_hosts_the_policy() else list(self.learner.lora.adapters)

    def default_adapter(self) -> str | None:
        """The adapter that serves agents named like no adapter: ``learner.lora.default_adapter``, or ``policy``
        when a Tinker key makes the swarm's policy that adapter (every agent uses it)."""
        return TINKER_SWARM_ADAPTER if self._tinker_hosts_the_policy() else self.learner.lora.default_adapter

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
                                                     "learner": {"group": {"auth_token"}},
                                                     "generator": {"fleet": {"token"}}})

    @staticmethod
    def secret(value: SecretStr | None) -> str | None:
        return value.get_secret_value() if value is not None else None
