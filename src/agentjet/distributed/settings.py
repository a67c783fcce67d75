"""Settings of a trainer group: one pydantic model, to be nested into the server's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator


class TrainerGroupSettings(BaseModel):
    """An FSDP2 trainer group: ``procs`` ranks per node under ``torch.distributed.run`` (see docs/distributed.md)."""

    model_config = ConfigDict(extra="forbid")

    procs: int = Field(1, ge=1, le=1024, description="trainer ranks on this node (torchrun --nproc-per-node)")
    nnodes: int = Field(1, ge=1, le=1024, description="nodes in the group (torchrun --nnodes)")
    node_rank: int = Field(0, ge=0, description="this node's rank in the group (torchrun --node-rank)")
    rdzv_endpoint: str | None = Field(None, description="host:port on node 0 for the torchrun rendezvous; needed "
                                      "with nnodes > 1 (one node alone uses a standalone rendezvous on a free port)")
    control_host: str = Field("127.0.0.1", description="where the server listens for its ranks (0.0.0.0 when "
                              "ranks on other nodes must reach it)")
    control_port: int = Field(0, ge=0, le=65535, description="port the ranks connect to (0: any free port; "
                              "set it with nnodes > 1 so the other nodes know it)")
    auth_token: SecretStr | None = Field(None, description="shared secret the ranks prove when they connect "
                                         "(random when None; needed with nnodes > 1: the other nodes read it "
                                         "from AGENTJET_TRAINER_TOKEN)")
    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="collectives: gloo on CPU, NCCL on CUDA")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when the ranks see a GPU")
    cuda_visible_devices: str | None = Field(None, pattern=r"^\d+(,\d+)*$", description="the GPUs of this node "
                                             "the ranks use, e.g. '2,3,4,5,6,7' when the rollout engine holds 0-1 "
                                             "(one rank per GPU; None: inherit CUDA_VISIBLE_DEVICES)")
    mixed_precision: bool = Field(True, description="on CUDA, bf16 parameters and fp32 gradient reduction "
                                  "(FSDP2 MixedPrecisionPolicy); ignored on CPU")
    gradient_checkpointing: bool = Field(False, description="recompute decoder activations in backward")
    threads_per_rank: int | None = Field(None, ge=1, le=512, description="torch CPU threads of each rank "
                                         "(None: torchrun's default of 1 when OMP_NUM_THREADS is unset)")
    startup_timeout_s: float = Field(300.0, gt=0, description="for the ranks to connect, load and shard the model")
    step_timeout_s: float = Field(600.0, gt=0, description="for one train step on every rank")
    push_timeout_s: float = Field(300.0, gt=0, description="for the weight export and the recovery snapshot "
                                  "after a step")
    collective_timeout_s: float = Field(300.0, gt=0, description="timeout of each collective (the process "
                                        "group's); a rank stuck longer than this fails its step")
    shutdown_timeout_s: float = Field(30.0, gt=0, description="grace for the ranks to exit before they are killed")
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
    def _check(self) -> TrainerGroupSettings:
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
