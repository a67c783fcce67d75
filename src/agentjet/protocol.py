"""The swarm protocol: pydantic models shared by the server and the client (``/swarm/v1``), and the records both
keep (``EvalPoint``). Pure: pydantic only, so a client that imports it loads nothing of the server."""

from __future__ import annotations

import enum
import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

SWARM_PREFIX = "/swarm/v1"
AGENT_HEADER = "X-Agent-Name"
DEFAULT_AGENT = "default"

Identifier = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:@/+=-]+$")]
Metadata = Annotated[dict[str, Any], Field(default_factory=dict)]


class EpisodeStatus(enum.StrEnum):
    OPEN = "open"
    ENDED = "ended"  # reward received, samples durable on disk (acknowledged)
    ABORTED = "aborted"  # the client gave up; nothing is trained
    EXPIRED = "expired"  # the lease ran out; nothing is trained
    PREPARED = "prepared"  # team episode: samples durable, waiting for the team's commit (two-phase)


class _Request(BaseModel):
    """A body the server reads: an unknown field is refused (a 400 naming it), never silently dropped."""

    model_config = ConfigDict(extra="forbid")


class _Reply(BaseModel):
    """A body the client reads: fields it does not know (a newer server's) are ignored, so that an older client
    keeps working against a newer server."""

    model_config = ConfigDict(extra="ignore")


class _Record(BaseModel):
    """A record both sides keep in files (an eval point in a demo's JSON, a study's results): not a body on the
    wire. An unknown field is refused, so a file written wrong is found when it is read."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")  # a NaN reward survives JSON


class JoinRequest(_Request):
    client_id: Identifier
    labels: dict[str, str] = Field(default_factory=dict)


class JoinResponse(_Reply):
    client_id: str
    model: str
    policy_version: int
    lease_seconds: float
    released_episodes: int = Field(description="open episodes of an earlier process with this client id, released now")
    group_size: int | None = Field(default=None, description="the server's GRPO group size: episodes per task id "
                                   "(a runner uses it unless told otherwise)")
    sampling: dict[str, Any] = Field(default_factory=dict, description="the server's sampling defaults "
                                     "(temperature, top_p, max_tokens)")


class BeginEpisodeRequest(_Request):
    client_id: Identifier
    task_id: Identifier
    task_type: Identifier = "default"
    group_id: Identifier | None = Field(default=None, description="GRPO group key; defaults to task_id")
    eval: bool = Field(default=False, description="eval episodes are never trained on")
    metadata: Metadata
    agents: list[Identifier] | None = Field(default=None, max_length=64, description="the agents (roles) this "
                                            "episode will call, when known: on a server with several LoRA adapters, "
                                            "admission counts it only against their adapters (default: all)")
    wait_s: float | None = Field(default=None, ge=0, le=3600, description="beyond capacity, how long the server "
                                 "may hold this begin until its group fits (a long poll); default: the server's "
                                 "training.admission_wait_s (the most it holds); 0: answer 429 at once")


class BeginEpisodeResponse(_Reply):
    episode_id: str
    api_key: str
    base_url: str = Field(description="the OpenAI-compatible base URL (``.../v1``): chat completions, Responses, "
                          "legacy completions")
    lease_seconds: float
    policy_version: int
    anthropic_base_url: str | None = Field(default=None, description="the base URL an Anthropic client takes (it "
                                           "appends /v1/messages itself); null from an older server")
    model: str | None = Field(default=None, description="the served model's name (what a harness names as its "
                              "model); null from an older server")


class HeartbeatResponse(_Reply):
    episode_id: str
    status: EpisodeStatus
    lease_remaining_seconds: float
    policy_version: int


Reward = float | dict[str, float]
MAX_ABS_REWARD = 1e9


def reward_mean(reward: Reward) -> float:
    """A scalar, or the mean of per-agent rewards."""
    if isinstance(reward, dict):
        return sum(reward.values()) / len(reward) if reward else 0.0
    return float(reward)


class EndEpisodeRequest(_Request):
    reward: Reward = Field(description="a scalar for every agent, or one reward per agent name")
    metadata: Metadata
    ignore_unused_agents: bool = Field(
        default=False, description="accept (and ignore) per-agent rewards for agents that made no calls here")

    @field_validator("reward")
    @classmethod
    def _finite(cls, v: Reward) -> Reward:
        values = v.values() if isinstance(v, dict) else [v]
        if isinstance(v, dict) and not v:
            raise ValueError("reward dict is empty")
        for x in values:
            if not math.isfinite(x):
                raise ValueError("reward must be a finite number (no NaN or infinity)")
            if abs(x) > MAX_ABS_REWARD:  # near the float limit the advantage estimators overflow
                raise ValueError(f"reward must be between -{MAX_ABS_REWARD:g} and {MAX_ABS_REWARD:g}")
        return v


class EndEpisodeResponse(_Reply):
    episode_id: str
    status: EpisodeStatus
    acknowledged: bool
    duplicate: bool = Field(description="true when this end was already received (idempotent retry)")
    calls: int
    samples: int


class AbortEpisodeRequest(_Request):
    reason: str = Field(default="", max_length=2000)


class AbortEpisodeResponse(_Reply):
    episode_id: str
    status: EpisodeStatus


class BufferCounts(_Reply):
    open_episodes: int
    pending_episodes: int  # acknowledged, waiting in the store to be trained
    trained_episodes: int
    dropped_stale_episodes: int
    dropped_uniform_episodes: int  # groups whose rewards were all equal (no learning signal)
    expired_episodes: int
    aborted_episodes: int
    eval_episodes: int


class AdapterStatus(_Reply):
    """One LoRA adapter of a server that hosts several on one base: its own training lane."""

    policy_version: int = Field(description="this adapter's served version (its step committed, its weights served)")
    learner_version: int = Field(description="this adapter's learner version")
    weight_push_in_flight: bool = False
    train_steps: int
    trained_episodes: int
    trained_tokens: int
    pending_episodes: int = Field(description="acknowledged episodes this adapter has yet to consume")
    dropped_stale_episodes: int
    dropped_uniform_episodes: int
    last_train_metrics: dict[str, float | None] = Field(default_factory=dict)
    training_halted: str | None = None


class TinkerClientStatus(_Reply):
    """One Tinker training client (``docs/tinker.md``): its own LoRA adapter on the served base."""

    session_id: str
    rank: int
    steps: int = Field(description="optim_step calls done")
    forward_backward_calls: int = 0
    last_loss: float | None = Field(None, description="the loss (a sum over tokens) of its latest forward_backward")


class TinkerStatus(_Reply):
    """The Tinker training API's clients, on a server started with ``--tinker-key``."""

    sessions: int = Field(description="open SDK sessions (each holds a lease renewed by its heartbeat)")
    sampling_clients: int = Field(description="sampling sessions held (snapshots and the base)")
    training_clients: dict[str, TinkerClientStatus] = Field(default_factory=dict, description="by model id (its "
                                                            "adapter's name)")


class ReplicaStatus(_Reply):
    """One generator replica behind the server's router (``docs/distributed.md``, "Rollout replicas")."""

    name: str
    state: str = Field(description="starting, serving (in rotation), out (taken out: died, hung or a push failed; "
                       "a restart is due), restarting, failed (restarts used up) or stopped")
    where: str = Field(description="where it runs: a process on this machine, a Ray actor on a node, or a machine "
                       "that joined")
    policy_version: int = Field(description="the version of the weights it holds")
    in_flight: int = Field(description="calls it is generating now")
    sessions: int = Field(description="episodes (and Tinker sampling clients) whose calls go to it")
    calls: int = Field(description="calls it completed")
    tokens: int = Field(description="tokens of the calls it completed")
    failed_calls: int = Field(description="calls it did not complete (each went on on another replica)")
    restarts: int
    pushes: int = Field(description="weight pushes it took")
    push_failures: int = Field(description="weight pushes that failed on it (each took it out of rotation)")
    last_push_s: float = Field(description="seconds its latest weight push took (0 before the first)")
    push_s_total: float = Field(description="seconds of all its weight pushes")
    out_reason: str | None = Field(None, description="why it was last taken out of rotation")


class FleetStatus(_Reply):
    """The server's rollout fleet: its replicas and the router's counts."""

    replicas: list[ReplicaStatus]
    serving: int = Field(description="replicas in rotation")
    routed_calls: int = Field(description="calls routed (each attempt of a call that moved counts once)")
    affinity_hits: int = Field(description="calls of a session sent to the replica that served its earlier calls")
    new_sessions: int = Field(description="new sessions (and calls without one) sent to the least-loaded replica")
    rebound_sessions: int = Field(description="sessions moved to another replica because theirs left rotation")
    failovers: int = Field(description="calls that went on on another replica after theirs died or hung")
    failover_tokens: int = Field(description="tokens generated before a failover and kept (the call went on from "
                                 "them)")
    unavailable: int = Field(description="calls that found no replica in rotation in time (answered 503)")


class ServerStatus(_Reply):
    model: str
    engine: str
    engine_info: dict[str, Any] = Field(default_factory=dict, description="what runs where: device, dtype, LoRA, "
                                        "batch size, context")
    engine_state: str
    policy_version: int = Field(description="the served version: its train step is committed (its episodes count "
                                "as trained) and the generator serves its weights")
    learner_version: int | None = Field(None, description="the learner's version: one ahead of policy_version while "
                                        "a weight push is in flight (or after one failed); null from an older server")
    weight_push_in_flight: bool = Field(False, description="true while the learner's weights are pushed to the "
                                        "generator")
    train_steps: int
    buffer: BufferCounts
    clients: list[str]
    throughput: dict[str, float]
    eval_reward: dict[str, float] = Field(description="mean eval reward per policy version")
    last_train_metrics: dict[str, float | None] = Field(description="the latest step's metrics (a NaN is null)")
    task_types: dict[str, dict[str, float]] = Field(default_factory=dict, description="trained episodes and mean "
                                                    "reward per task type")
    levels: dict[str, int] = Field(default_factory=dict, description="per task type trained on difficulty levels "
                                   "(ajet demo --levels), the level its clients noted on its latest training "
                                   "episode (the end's metadata.level); empty when no client notes one")
    config: dict[str, Any]
    training_halted: str | None = Field(None, description="why training stopped by itself (e.g. the rollout "
                                        "engine does not serve the trained weights); null while it runs")
    weight_syncs: int | None = Field(None, description="weight pushes from the learner to the generator since "
                                     "start; null for an engine without a weight-sync seam")
    weight_sync_failures: int | None = Field(None, description="pushes that failed after a committed step (the "
                                             "generator served the previous version until the next push)")
    adapters: dict[str, AdapterStatus] = Field(default_factory=dict, description="per LoRA adapter, on a server "
                                               "that hosts several (train_steps above is their sum, policy_version "
                                               "the oldest of theirs); empty with one policy")
    tinker: TinkerStatus | None = Field(None, description="the Tinker API's sessions and training clients; null "
                                        "when it is off (no --tinker-key)")
    fleet: FleetStatus | None = Field(None, description="the generator replicas behind the router and its counts; "
                                      "null with one generator")


class ConfigChange(_Request):
    """A live settings change: live settings (each marked so where it is declared, in ``agentjet.settings``) by section. A
    setting that is not live, or an old name (``training.learning_rate``, now ``learner.learning_rate``), is
    refused with a 400 that names it."""

    learner: dict[str, Any] = Field(default_factory=dict)
    training: dict[str, Any] = Field(default_factory=dict)
    sampling: dict[str, Any] = Field(default_factory=dict)
    loss: dict[str, Any] = Field(default_factory=dict)
    force: bool = Field(default=False, description="apply a task_ratios change that shuts out running task types")


class AddAdapterRequest(_Request):
    """Add a LoRA adapter to a running server that hosts several (``ajet ctl adapter add``)."""

    name: str = Field(min_length=1, max_length=64, description="the adapter's name: the agent name that uses it")
    rank: int | None = Field(None, ge=1, le=1024, description="its LoRA rank (default: the server's --lora-rank)")


class AdapterChange(_Reply):
    """The answer to adding or removing an adapter: the adapters from now on."""

    adapters: list[str]
    added: str | None = None
    removed: str | None = None


class PauseRequest(_Request):
    wait_for_step: bool = Field(default=False, description="answer only once a train step in progress has "
                                "finished, so no step runs after the answer until resume")


class PauseState(_Reply):
    """The answer to pause and resume: whether training is paused, and where it stands."""

    paused: bool
    policy_version: int
    train_steps: int


class CheckpointRequest(_Request):
    """``POST /swarm/v1/control/checkpoint``: a checkpoint of the committed step now, or, with ``best_eval``, the
    step pinned as the run's best when that eval beats the pinned one (written only then)."""

    best_eval: float | None = Field(None, allow_inf_nan=False, description="the held-out eval of the policy "
                                    "being served, measured while training was paused: pin this step's "
                                    "checkpoint as the run's best if the eval beats the pinned one's")


class BestCheckpoint(_Reply):
    """The checkpoint pinned as the run's best (``checkpoints/best.json``; never pruned)."""

    path: str
    eval: float
    train_steps: int
    policy_version: int


class CheckpointResult(_Reply):
    path: str = Field(description="the checkpoint written, or, with best_eval, the one pinned as the best")
    train_step: int
    policy_version: int
    best: BestCheckpoint | None = Field(None, description="the run's best checkpoint after this call (null until "
                                        "a client reports an eval)")
    pinned: bool = Field(False, description="whether this call moved the best pin to this step")


class ChangeRecord(_Reply):
    at: float
    policy_version: int = Field(description="the policy version current when the change took effect")
    train_step: int
    changes: dict[str, Any]


class TeamDecision(enum.StrEnum):
    COMMITTED = "committed"
    ABORTED = "aborted"
    UNDECIDED = "undecided"


class PrepareEpisodeRequest(EndEpisodeRequest):
    """Phase one of a team episode: make the samples durable, but do not train them until commit."""

    team_id: Identifier
    team_secret: str = Field(min_length=32, max_length=256, description="shared by the team's members; "
                             "authorises the participants' decision queries to the coordinator")
    coordinator_url: str | None = Field(default=None, max_length=2000, description="the coordinator server's URL; "
                                        "None when this server is the coordinator")


class TeamDecisionResponse(_Reply):
    team_id: str
    decision: TeamDecision


# ------------------------------------------------------------------ records the client and the server share
class EvalPoint(_Record):
    """One held-out evaluation: where training stood, and what the eval scored. The one eval-point record: the
    driver (``agentjet.client.driver``) takes them, the demo, ``ajet research`` and the benchmarks keep them, a
    ``LearnCurve`` (``agentjet.observe.learncurve``) is a list of them, and ``agentjet.observe.curveplot.plot_curves``
    draws them. Here, beside the wire models, because the client (which may not import ``observe``) makes them."""

    train_steps: int
    policy_version: int | None = Field(None, description="None: the record did not say (early demo curves)")
    reward: float = Field(description="mean reward of the eval episodes (NaN: none finished)")
    episodes: int = Field(0, description="eval episodes that finished with a reward")
    failed: int = Field(0, description="eval episodes that failed")
    train_seconds: float | None = Field(0.0, description="the training clock: time since training started, less "
                                        "pauses (None: not recorded, the first demos)")
    seconds: float | None = Field(0.0, description="time since training started, pauses included (None: unknown)")
    eval_seconds: float = Field(0.0, description="how long the evaluation took")
    levels: dict[str, int] = Field(default_factory=dict, description="with difficulty levels: each task type's "
                                   "level being trained at this eval (empty: no levels)")
    level_rewards: dict[str, float] = Field(default_factory=dict, description="with difficulty levels: each task "
                                            "type's held-out reward at that level (``reward`` is the task as named, "
                                            "the fixed starting point)")

    @property
    def train_minutes(self) -> float | None:
        return None if self.train_seconds is None else self.train_seconds / 60

    @property
    def minutes(self) -> float | None:
        return None if self.seconds is None else self.seconds / 60

    def x(self, axis: str) -> float | None:
        """The point's position on ``axis``: ``steps`` (train steps), ``train_minutes`` or ``minutes`` (wall)."""
        if axis == "steps":
            return float(self.train_steps)
        if axis in ("train_minutes", "minutes"):
            return getattr(self, axis)
        raise ValueError(f"unknown curve axis {axis!r} (steps, train_minutes, minutes)")
