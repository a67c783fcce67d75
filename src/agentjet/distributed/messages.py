"""What the parent (the server) and its ranks say to each other.

Each rank holds one authenticated connection to the parent (``multiprocessing.connection``: length-framed,
HMAC challenge on connect). The parent sends every rank the same command kind (with that rank's share of a
batch); every rank answers, so the parent sees at once which rank failed or went silent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentjet.engines.base import TrainSample
from agentjet.learners.policy_step import StepConfig

TOKEN_ENV = "AGENTJET_LEARNER__GROUP__AUTH_TOKEN"  # the shared secret; never on a command line


# ---------------------------------------------------------------- rank -> parent
@dataclass(frozen=True)
class Hello:
    rank: int
    world_size: int
    local_rank: int
    host: str
    pid: int


@dataclass(frozen=True)
class Done:
    """A command finished on this rank. ``info`` carries the command's results (metrics, paths, timings)."""

    rank: int
    kind: str
    info: dict[str, Any] = field(default_factory=dict)  # numbers and paths; a step's trainer logprobs


@dataclass(frozen=True)
class Failed:
    rank: int
    kind: str
    error: str


# ---------------------------------------------------------------- parent -> ranks
@dataclass(frozen=True)
class Init:
    model: str  # a local Hugging Face model directory (the same path on every node)
    step_config: StepConfig
    device: str  # "cpu" or "cuda"
    backend: str  # "gloo" or "nccl"
    mixed_precision: bool
    gradient_checkpointing: bool
    collective_timeout_s: float
    threads: int | None
    restore: str | None  # a sharded checkpoint (torch.distributed.checkpoint) to start from


@dataclass(frozen=True)
class Step:
    """One train step. ``micro_batches`` is this rank's share; every rank runs ``n_micro`` forward/backward
    passes (FSDP collectives must match), padding its share with zero-weight passes. ``total_weight`` is the
    whole batch's, so the summed gradient equals the single-process one."""

    version: int  # the policy version this step produces
    config: StepConfig  # the current learning rate and loss settings (live changes reach the ranks this way)
    micro_batches: list[list[TrainSample]]
    n_micro: int
    total_weight: float
    export_path: str  # rank 0 writes the full weights here (safetensors, untied)
    snapshot_dir: str  # every rank writes its shard of model + optimizer here (the recovery point)


@dataclass(frozen=True)
class Score:
    """Logprobs of each sample's trained tokens under the current weights, no update (a probe). Shares and
    passes as in :class:`Step`."""

    micro_batches: list[list[TrainSample]]
    n_micro: int


@dataclass(frozen=True)
class Save:
    path: str


@dataclass(frozen=True)
class Load:
    path: str


@dataclass(frozen=True)
class Shutdown:
    pass


Command = Init | Step | Score | Save | Load | Shutdown
Reply = Hello | Done | Failed
