"""The learner's settings (``learner``): the optimizer, how a train step is cut into micro-batches, LoRA
(``learner.lora``) and the learner's processes (``learner.group``), and the loss it minimises (``loss``). prime-rl's
counterpart is its trainer config."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, SecretStr, model_validator

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
from agentjet.settings.section import LIVE, CommaList, Section

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


class LoraSettings(Section):
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


class LearnerGroupSettings(Section):
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


class LearnerSettings(Section):
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
    flat_masters: bool = Field(False, description="bf16/fp16 weights: their fp32 master copies (and each step's "
                               "fp32 gradient) in one flat buffer, so AdamW and the clipping step one tensor instead "
                               "of one per weight (fewer kernel launches; the same update up to the gradient norm's "
                               "summation order; every trained weight must get a gradient each step). Not for a "
                               "trainer group's sharded weights")
    compile_logprobs: bool = Field(False, description="run each logprob chunk's work in training through "
                                   "torch.compile (fused kernels; the same values up to their rounding; the first "
                                   "step compiles, for seconds to a minute; the in-process learner)")
    lora: LoraSettings = Field(default_factory=LoraSettings)
    group: LearnerGroupSettings = Field(default_factory=LearnerGroupSettings)


class LossSettings(Section):
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
