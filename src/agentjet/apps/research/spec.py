"""The study file: the question, the metric, the search space, the budget, and how each trial runs.

    question: Which learning rate and group size learn single-digit addition fastest?
    base:                                  # an `ajet up` spec (inline, or a path to swarm.yaml)
      servers:
        policy: {model: smollm2-135m-instruct, options: {max-staleness: 2}}
    client: {task: addition, steps: 6, eval_every: 2}
    space:
      server.lr: {type: float, low: 1.0e-5, high: 1.0e-4, log: true, default: 2.0e-5}
      server.group-size: {type: choice, choices: [4, 8], default: 8}
    seeds: 2
    budget: {trials: 8, minutes: 60}

A search-space name is ``server.<ajet server option>`` (applied to the trial's primary server) or
``client.<setting>`` (a field of :class:`TrialClientSettings` for the built-in trial client; for clients
of your own, any name: they get the values as JSON in ``$AJET_TRIAL_PARAMS``).
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentjet.apps.up import ClientSpec, server_spec
from agentjet.settings import SettingsError
from agentjet.tasks import DEFAULT_TASK

Scalar = bool | int | float | str

PLACEHOLDER_PORT = 1  # base specs may leave ports out: every trial gets free ports of its own


class StudySpecError(ValueError):
    """A study file or command line that cannot be used; the message names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ParamType(enum.StrEnum):
    FLOAT = "float"
    INT = "int"
    CHOICE = "choice"


class ParamTarget(enum.StrEnum):
    SERVER = "server"
    CLIENT = "client"


class Param(_Strict):
    """One dimension of the search space."""

    type: ParamType
    low: float | None = None
    high: float | None = None
    log: bool = Field(False, description="sample (and clamp) on a log scale")
    choices: list[Scalar] | None = None
    default: Scalar | None = Field(None, description="the value of the baseline configuration")
    grid: list[Scalar] | None = Field(None, description="values a grid planner tries (default: the choices, or "
                                                        "low, middle and high)")

    @model_validator(mode="after")
    def _check(self) -> Param:
        if self.type is ParamType.CHOICE:
            if not self.choices:
                raise ValueError("a choice parameter needs a non-empty `choices` list")
            if len({json.dumps(c) for c in self.choices}) != len(self.choices):
                raise ValueError("`choices` must not repeat")
            if self.low is not None or self.high is not None or self.log:
                raise ValueError("a choice parameter takes `choices`, not low/high/log")
        else:
            if self.low is None or self.high is None:
                raise ValueError(f"a {self.type} parameter needs `low` and `high`")
            if not self.low < self.high:
                raise ValueError(f"`low` ({self.low}) must be below `high` ({self.high})")
            if self.log and self.low <= 0:
                raise ValueError("a log-scale parameter needs `low` > 0")
            if self.type is ParamType.INT and (self.low != int(self.low) or self.high != int(self.high)):
                raise ValueError("an int parameter needs integer `low` and `high`")
            if self.choices is not None:
                raise ValueError(f"a {self.type} parameter takes low/high, not `choices`")
        for label, values in (("default", [] if self.default is None else [self.default]), ("grid", self.grid or [])):
            for v in values:
                if not self.contains(v):
                    raise ValueError(f"{label} value {v!r} is outside the parameter's space")
        return self

    def contains(self, value: Any) -> bool:
        if self.type is ParamType.CHOICE:
            return any(_same(value, c) for c in self.choices or [])
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return False
        if self.type is ParamType.INT and value != int(value):
            return False
        assert self.low is not None and self.high is not None
        return self.low <= value <= self.high

    def clamp(self, value: Any) -> Scalar:
        """The nearest value in the space. Raises ValueError for a value that has no nearest one (a choice
        that is not offered, a number that is not a number)."""
        if self.type is ParamType.CHOICE:
            for c in self.choices or []:
                if _same(value, c):
                    return c
            raise ValueError(f"{value!r} is not one of {self.choices}")
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a number") from None
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise ValueError(f"{value!r} is not a number")
        assert self.low is not None and self.high is not None
        clamped = min(max(float(value), self.low), self.high)
        return int(round(clamped)) if self.type is ParamType.INT else clamped

    def grid_points(self) -> list[Scalar]:
        if self.grid:
            return list(self.grid)
        if self.type is ParamType.CHOICE:
            return list(self.choices or [])
        assert self.low is not None and self.high is not None
        mid = math.sqrt(self.low * self.high) if self.log else (self.low + self.high) / 2
        points: list[Scalar] = [self.low, mid, self.high]
        if self.type is ParamType.INT:
            points = sorted({int(round(float(p))) for p in points})
        return points

    def describe(self) -> str:
        if self.type is ParamType.CHOICE:
            return "one of " + ", ".join(str(c) for c in self.choices or [])
        return f"{self.type} in [{self.low:g}, {self.high:g}]" + (" (log scale)" if self.log else "")


def _same(a: Any, b: Any) -> bool:
    """Choice equality that keeps 1 and True apart but lets 8 and 8.0 match."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


class Direction(enum.StrEnum):
    MAXIMIZE = "maximize"
    MINIMIZE = "minimize"


class MetricSource(enum.StrEnum):
    EVAL_REWARD = "eval_reward"  # the server's mean eval-episode reward per policy version
    TRAIN_REWARD = "train_reward"  # the mean reward of the latest train batch (last_train_metrics.reward_mean)


class Aggregate(enum.StrEnum):
    LAST = "last"  # the value at the last eval point: what the trained policy does
    BEST = "best"  # the best value at any eval point


class Metric(_Strict):
    source: MetricSource = MetricSource.EVAL_REWARD
    direction: Direction = Direction.MAXIMIZE
    aggregate: Aggregate = Aggregate.LAST

    def better(self, a: float, b: float) -> bool:
        return a > b if self.direction is Direction.MAXIMIZE else a < b

    def label(self) -> str:
        return f"{self.source} ({self.aggregate} eval point, {self.direction})"


class Budget(_Strict):
    trials: int | None = Field(None, ge=1, description="runs in all (each seed of a configuration is a run)")
    minutes: float | None = Field(None, gt=0, description="no new run starts after this much study time")

    @model_validator(mode="after")
    def _some(self) -> Budget:
        if self.trials is None and self.minutes is None:
            raise ValueError("give the budget as `trials` (runs), `minutes` (wall time), or both")
        return self


class PlannerKind(enum.StrEnum):
    TPE = "tpe"
    RANDOM = "random"
    GRID = "grid"
    LLM = "llm"


class PlannerSettings(_Strict):
    kind: PlannerKind = PlannerKind.TPE
    seed: int = 0
    include_default: bool = Field(True, description="run the default configuration (each parameter's `default`) "
                                                    "first, as the baseline")
    url: str | None = Field(None, description="OpenAI-compatible base URL for the LLM planner, e.g. "
                                              "http://127.0.0.1:8000/v1")
    model: str = "default"
    api_key_env: str = Field("AJET_PLANNER_API_KEY", description="environment variable holding the key, if any")
    timeout_s: float = Field(60.0, gt=0)
    proposals_per_call: int = Field(2, ge=1, le=16)

    @model_validator(mode="after")
    def _url(self) -> PlannerSettings:
        if self.kind is PlannerKind.LLM and not self.url:
            raise ValueError("the llm planner needs `url` (an OpenAI-compatible base URL)")
        return self


class EarlyStopSettings(_Strict):
    enabled: bool = True
    reduction_factor: int = Field(2, ge=2, description="ASHA: at each rung only the top 1/rf continue")
    min_step: int | None = Field(None, ge=1, description="first rung (policy version); default: the client's "
                                                         "eval_every")
    min_delta: float = Field(0.05, ge=0, description="'clearly behind': a run is stopped only when ASHA says so "
                                                     "AND it trails the best run at that step by more than this")


class HealthSettings(_Strict):
    poll_s: float = Field(2.0, gt=0)
    start_timeout_s: float = Field(600.0, gt=0, description="from launch until the server answers its status")
    stall_s: float = Field(600.0, gt=0, description="no progress (steps, episodes, evals) for this long: stalled")
    run_timeout_s: float | None = Field(None, gt=0, description="hard limit per run (default: the client's "
                                                               "time_budget_s + start_timeout_s + 300)")
    retries: int = Field(1, ge=0, description="a crashed or stalled run is restarted this many times")
    stop_grace_s: float = Field(90.0, gt=0)
    keep_checkpoints: bool = Field(False, description="keep each trial server's checkpoints (large)")


class RaySettings(_Strict):
    """What each trial reserves on a Ray cluster (``ajet research --ray ADDRESS``; unused without it)."""

    cpus: float = Field(1.0, ge=0, description="CPUs each trial reserves on its node")
    gpus_per_server: float = Field(0.0, ge=0, description="GPUs each server of a trial reserves (a trial "
                                                          "reserves this times its servers)")
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources each trial "
                                        "reserves, e.g. {trial_slot: 1}")


class TrialClientSettings(_Strict):
    """The built-in trial client (``agentjet.apps.research.trial_client``): train on a task's train split, evaluate
    on its held-out split every ``eval_every`` train steps (training paused meanwhile)."""

    task: str = Field(DEFAULT_TASK, description="a built-in task name, rg:NAME (a reasoning-gym dataset, docs/environments.md) or path/to/task.py")
    steps: int = Field(8, ge=1, description="train steps per run")
    eval_every: int = Field(2, ge=1, description="train steps between held-out evaluations")
    eval_n: int | None = Field(None, ge=1, description="held-out eval episodes per eval point (default: the "
                                                      "task's RECOMMENDED eval_n, else 44)")
    concurrency: int = Field(8, ge=1, le=1024)
    time_budget_s: float = Field(900.0, gt=0, description="of training time (evals not counted); a final eval follows")
    temperature: float | None = Field(None, ge=0, le=5, description="train sampling (eval keeps the task's)")
    top_p: float | None = Field(None, gt=0, le=1, description="train sampling (eval keeps the task's)")
    max_tokens: int | None = Field(None, ge=1, description="train and eval replies")
    pool: int = Field(64, ge=1, description="train tasks per shuffled round")


class SwarmTemplate(_Strict):
    """The `ajet up` spec every trial starts from. Server entries stay as written (a run adds its port, data dir
    and searched settings), but each is validated as a server's settings at once, so a bad option fails the
    study before any run starts."""

    servers: dict[str, dict[str, Any]] = Field(min_length=1)
    clients: dict[str, ClientSpec] = Field(default_factory=dict)
    log_dir: str = "runs/up"

    @model_validator(mode="after")
    def _valid_servers(self) -> SwarmTemplate:
        for name, raw in self.servers.items():
            try:
                server_spec(name, {**raw, "port": raw.get("port") or PLACEHOLDER_PORT}, Path(self.log_dir))
            except SettingsError as exc:
                raise ValueError(f"server {name!r}: {exc}") from exc
        return self

    def host(self, name: str) -> str:
        return str(self.servers[name].get("host", "127.0.0.1"))

    def options(self, name: str) -> dict[str, Any]:
        return dict(self.servers[name].get("options") or {})


class StudySpec(_Strict):
    name: str | None = Field(None, description="a short name (default: from the question)")
    question: str = Field(min_length=1)
    metric: Metric = Field(default_factory=Metric)
    base: SwarmTemplate = Field(description="an `ajet up` spec (inline or a path): the servers and, optionally, "
                                        "clients of every trial; ports are chosen per trial")
    server: str | None = Field(None, description="the server whose settings `server.*` tune and whose status "
                                                 "is watched (default: the only one)")
    client: TrialClientSettings = Field(default_factory=TrialClientSettings)
    space: dict[str, Param] = Field(min_length=1)
    seeds: int = Field(1, ge=1, le=100, description="runs per configuration")
    parallel: int = Field(1, ge=1, le=64)
    budget: Budget = Field(default_factory=lambda: Budget(trials=8))
    planner: PlannerSettings = Field(default_factory=PlannerSettings)
    early_stop: EarlyStopSettings = Field(default_factory=EarlyStopSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    ray: RaySettings = Field(default_factory=RaySettings)

    @field_validator("base", mode="before")
    @classmethod
    def _fill_ports(cls, v: Any) -> Any:
        if isinstance(v, dict):
            servers = v.get("servers")
            if isinstance(servers, dict):
                v = {**v, "servers": {n: ({"port": PLACEHOLDER_PORT, **s} if isinstance(s, dict) else s)
                                      for n, s in servers.items()}}
        return v

    @model_validator(mode="after")
    def _check(self) -> StudySpec:
        if self.server is None:
            if len(self.base.servers) != 1:
                raise ValueError(f"base has {len(self.base.servers)} servers: name the watched one in `server`")
            self.server = next(iter(self.base.servers))
        elif self.server not in self.base.servers:
            raise ValueError(f"server {self.server!r} is not in base.servers ({sorted(self.base.servers)})")
        if self.budget.trials is not None and self.budget.trials < self.seeds:
            raise ValueError(f"budget.trials ({self.budget.trials}) is below seeds ({self.seeds}): no configuration "
                             "could run all its seeds")
        client_fields = set(TrialClientSettings.model_fields)
        for name in self.space:
            target, _, key = name.partition(".")
            if target not in {t.value for t in ParamTarget} or not key:
                raise ValueError(f"space name {name!r} must start with `server.` or `client.`")
            if target == ParamTarget.CLIENT and not self.base.clients and key not in client_fields:
                raise ValueError(f"space name {name!r}: the built-in trial client has no setting {key!r} "
                                 f"(it has {sorted(client_fields)})")
            if target == ParamTarget.CLIENT and not self.base.clients and key == "task":
                raise ValueError("client.task cannot be searched: the metric would change meaning")
        return self

    # ------------------------------------------------------------------ derived
    @property
    def primary(self) -> str:
        assert self.server is not None
        return self.server

    def slug(self) -> str:
        text = self.name or self.question
        return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48] or "study"

    def default_params(self) -> dict[str, Scalar] | None:
        """The baseline: each parameter's default, else the base spec's value; None when one is unknown."""
        out: dict[str, Scalar] = {}
        options = self.base.options(self.primary)
        for name, p in self.space.items():
            target, _, key = name.partition(".")
            value: Any = p.default
            if value is None and target == ParamTarget.SERVER:
                value = options.get(key, options.get(key.replace("-", "_")))
            if value is None and target == ParamTarget.CLIENT and not self.base.clients:
                value = getattr(self.client, key, None)
            if value is None or not p.contains(value):
                return None
            out[name] = p.clamp(value)
        return out

    def digest(self) -> str:
        """What must not change under a study's feet: question, metric, base, client, space, seeds."""
        core = self.model_dump(mode="json", include={"question", "metric", "base", "server", "client", "space",
                                                     "seeds"})
        return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()[:16]

    def run_timeout_s(self) -> float:
        h = self.health
        return h.run_timeout_s or self.client.time_budget_s + h.start_timeout_s + 300

    def first_rung(self) -> int:
        return self.early_stop.min_step or self.client.eval_every


def split_params(params: dict[str, Scalar]) -> tuple[dict[str, Scalar], dict[str, Scalar]]:
    """(server options, client settings) of a configuration."""
    server: dict[str, Scalar] = {}
    client: dict[str, Scalar] = {}
    for name, value in params.items():
        target, _, key = name.partition(".")
        (server if target == ParamTarget.SERVER else client)[key] = value
    return server, client


def _errors(exc: ValidationError) -> str:
    return "\n".join(f"  {'.'.join(str(x) for x in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors())


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise StudySpecError(f"cannot read {path}: {exc}") from exc


def validate_spec(raw: Any, where: str, root: Path) -> StudySpec:
    """Validate a study mapping; a string ``base`` is a path to a swarm file, relative to ``root``."""
    if not isinstance(raw, dict):
        raise StudySpecError(f"{where} must be a mapping (question, base, space, ...)")
    if isinstance(raw.get("base"), str):
        base_path = (root / raw["base"]).resolve()
        raw = {**raw, "base": _read_yaml(base_path)}
    try:
        return StudySpec.model_validate(raw)
    except ValidationError as exc:
        raise StudySpecError(f"{where} is not a valid study:\n{_errors(exc)}") from exc


def load_study(path: Path) -> StudySpec:
    return validate_spec(_read_yaml(path), str(path), path.parent)


# ---------------------------------------------------------------------- command-line shorthand
_RANGE = re.compile(r"^(?P<low>[^.:][^:]*?)\.\.(?P<high>[^:]+)$")


def parse_scalar(text: str) -> Scalar:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, bool | int | float | str) else text


def parse_space_item(item: str) -> tuple[str, Param]:
    """``name=low..high[:log][:int][:default=X]`` or ``name=a,b,c[:default=X]``."""
    name, sep, rest = item.partition("=")
    if not sep or not name.strip() or not rest:
        raise StudySpecError(f"--space {item!r} must look like server.lr=1e-5..1e-4:log or server.group-size=4,8")
    body, *flags = rest.split(":")
    fields: dict[str, Any] = {}
    kind: ParamType | None = None
    for flag in flags:
        key, eq, value = flag.partition("=")
        if key == "log" and not eq:
            fields["log"] = True
        elif key == "int" and not eq:
            kind = ParamType.INT
        elif key == "default" and eq:
            fields["default"] = parse_scalar(value)
        else:
            raise StudySpecError(f"--space {item!r}: unknown flag {flag!r} (log, int, default=X)")
    match = _RANGE.match(body)
    if match:
        low, high = parse_scalar(match["low"]), parse_scalar(match["high"])
        if isinstance(low, bool | str) or isinstance(high, bool | str):
            raise StudySpecError(f"--space {item!r}: the range ends must be numbers")
        if kind is None:
            kind = ParamType.INT if isinstance(low, int) and isinstance(high, int) and not fields.get("log") \
                else ParamType.FLOAT
        fields.update(type=kind, low=low, high=high)
    else:
        if kind is not None:
            raise StudySpecError(f"--space {item!r}: `int` applies to a low..high range")
        fields.update(type=ParamType.CHOICE, choices=[parse_scalar(c) for c in body.split(",")])
    try:
        return name.strip(), Param.model_validate(fields)
    except ValidationError as exc:
        raise StudySpecError(f"--space {item!r}:\n{_errors(exc)}") from exc


def spec_from_args(question: str, base: Path, space: list[str], extra: dict[str, Any]) -> StudySpec:
    """A study from the command line: a question, a swarm file and ``--space`` items (plus any other fields)."""
    if not space:
        raise StudySpecError("give at least one --space item, e.g. --space server.lr=1e-5..1e-4:log")
    params = dict(parse_space_item(item) for item in space)
    raw = {"question": question, "base": str(base), **extra,
           "space": {k: p.model_dump(exclude_none=True, exclude_defaults=True) | {"type": p.type.value}
                     for k, p in params.items()}}
    return validate_spec(raw, "the command line", Path.cwd())
