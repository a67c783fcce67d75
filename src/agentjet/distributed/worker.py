"""A trainer rank, run by ``torch.distributed.run``: ``python -m agentjet.distributed.worker --control HOST:PORT``.

It connects to the parent (the server) with the shared secret from ``AGENTJET_LEARNER__GROUP__AUTH_TOKEN``, receives
:class:`~agentjet.distributed.messages.Init`, builds its FSDP2 shard of the model, and then runs the parent's
commands until :class:`~agentjet.distributed.messages.Shutdown` or until the parent goes away. Every exit
ends with ``os._exit`` (after ``destroy_process_group`` when clean): see docs/architecture.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from agentjet.distributed.messages import (
    TOKEN_ENV,
    Done,
    Failed,
    Hello,
    Init,
    Load,
    Save,
    Score,
    Shutdown,
    Step,
)
from agentjet.distributed.plan import padding_sample
from agentjet.engines.memory import auto_micro_batch_tokens
from agentjet.learners.policy_step import (
    PaddedBatch,
    PolicyOptimizer,
    StepSums,
    collate,
    run_policy_step,
    trained_token_logprobs,
)
from agentjet.runtime.proc import die_with_parent
from agentjet.weights.io import untie, write_safetensors


class PolicyLogprobs(torch.nn.Module):
    """The FSDP root: a causal LM whose forward returns the logprobs of a padded batch's trained tokens. The
    head runs inside the root's forward, so FSDP2 gathers the embedding, the final norm and the (tied) head
    around it and reduces their gradients after backward."""

    def __init__(self, lm: torch.nn.Module, chunk_rows: int, bf16_autocast: bool) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_rows = chunk_rows
        self.bf16_autocast = bf16_autocast

    def forward(self, batch: PaddedBatch) -> torch.Tensor:
        lm: Any = self.lm  # a transformers causal LM (base_model, get_output_embeddings)
        return trained_token_logprobs(lm.base_model, lm.get_output_embeddings().weight, batch, self.chunk_rows,
                                      self.bf16_autocast)


def decoder_layers(lm: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks FSDP shards one by one: the model's own ``_no_split_modules`` classes (decoder layers)."""
    names = set(getattr(lm, "_no_split_modules", None) or ())
    layers = [m for m in lm.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"cannot find the decoder layers of {type(lm).__name__} (no _no_split_modules)")
    return layers


def shard(module: PolicyLogprobs, mixed_precision: bool) -> None:
    """``fully_shard`` on each decoder layer, then on the root. Gradients are summed across ranks (not
    averaged): each rank's loss is already normalised by the whole batch's weight."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision else None
    kwargs: dict[str, Any] = {"mp_policy": mp} if mp is not None else {}
    for layer in decoder_layers(module.lm):
        fully_shard(layer, **kwargs)
    fully_shard(module, **kwargs)
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM


class RankTrainer:
    """This rank's shard of the policy (and of the frozen reference, when the KL term is on) and optimizer."""

    def __init__(self, init: Init, rank: int, world_size: int, local_rank: int) -> None:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        from agentjet.engines.model import model_facts

        hf_logging.disable_progress_bar()
        self.rank, self.world_size = rank, world_size
        self.config = init.step_config
        if init.threads:
            torch.set_num_threads(init.threads)
        if init.device == "cuda":
            torch.cuda.set_device(local_rank)
            self.device = torch.device("cuda", local_rank)
        else:
            self.device = torch.device("cpu")
        dist.init_process_group(init.backend, timeout=timedelta(seconds=init.collective_timeout_s),
                                device_id=self.device if init.device == "cuda" else None)
        mixed = init.mixed_precision and init.device == "cuda"
        self.pad_id = model_facts(init.model).pad_id

        def build(trainable: bool) -> PolicyLogprobs:
            lm: Any = AutoModelForCausalLM.from_pretrained(init.model, dtype=torch.float32)
            lm = lm.to(self.device)
            if trainable and init.gradient_checkpointing:
                lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            lm.train(trainable)
            lm.requires_grad_(trainable)
            module = PolicyLogprobs(lm, self.config.logprob_chunk_tokens, self.config.bf16 and not mixed)
            shard(module, mixed)
            return module

        self.model = build(trainable=True)
        self.lm = self.model.lm
        self.reference = build(trainable=False) if self.config.kl_coef > 0 else None
        self.policy_optimizer = PolicyOptimizer(list(self.model.parameters()), self.config)
        self.optimizer = self.policy_optimizer.optimizer  # what the sharded checkpoints hold
        self._materialise_optimizer_state()
        # what this rank's free memory holds, once its shards and optimizer state are in place (the parent plans
        # with the smallest over the ranks when the setting leaves it unset)
        self.micro_batch_tokens = auto_micro_batch_tokens(
            self.lm.config, self.device, 2 if mixed or self.config.bf16 else 4, init.gradient_checkpointing)
        if init.restore:
            self.load(init.restore)

    @torch.no_grad()
    def _materialise_optimizer_state(self) -> None:
        """Create AdamW's state now, exactly as a fresh optimizer's (zero moments, step 0), so that a checkpoint
        can be saved or loaded before the first step. (torch.distributed.checkpoint would otherwise create it
        with a zero-gradient step, which leaves the step count at 1 and changes the next real step.)"""
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        lrs = [g["lr"] for g in self.optimizer.param_groups]
        for p in params:
            p.grad = torch.zeros_like(p)
        for g in self.optimizer.param_groups:
            g["lr"] = 0.0
        self.optimizer.step()
        for g, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            g["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        for state in self.optimizer.state.values():
            step = state.get("step")
            if isinstance(step, torch.Tensor):
                step.zero_()
            elif step is not None:
                state["step"] = 0

    # ------------------------------------------------------------- a step
    def _forward(self, samples: list) -> torch.Tensor:
        return self.model(collate(samples, self.pad_id, self.device))

    def _reference_forward(self, samples: list) -> torch.Tensor:
        assert self.reference is not None
        return self.reference(collate(samples, self.pad_id, self.device))

    def _reduce(self, sums: StepSums) -> StepSums:
        summed = sums.sums_tensor().to(self.device)
        dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        ratio_max = torch.tensor([sums.ratio_max], dtype=torch.float64, device=self.device)
        dist.all_reduce(ratio_max, op=dist.ReduceOp.MAX)
        return StepSums.from_reduced(summed.cpu(), float(ratio_max.item()))

    def train(self, step: Step) -> dict[str, object]:
        """This rank's share of the one policy step (``engines/policy_step.run_policy_step``); the sums are
        all-reduced, so every rank reports the whole step's metrics. ``trainer_logprobs``: this rank's samples'."""
        self.config = step.config
        self.model.train()
        try:
            metrics, used = run_policy_step(
                step.micro_batches, forward=self._forward,
                reference=self._reference_forward if self.reference is not None else None,
                total_weight=step.total_weight, config=step.config, optimizer=self.policy_optimizer,
                reduce=self._reduce, n_passes=step.n_micro, padding=[padding_sample(self.pad_id)])
        finally:
            self.model.eval()
        return {**metrics, "trainer_logprobs": used}

    @torch.no_grad()
    def score(self, cmd: Score) -> dict[str, object]:
        """Logprobs of this rank's share (no update); every rank runs ``n_micro`` passes (FSDP gathers)."""
        self.model.eval()
        used = []
        padding = [padding_sample(self.pad_id)]
        for i in range(cmd.n_micro):
            mb = cmd.micro_batches[i] if i < len(cmd.micro_batches) else padding
            lp = self._forward(mb).float()
            if i < len(cmd.micro_batches):
                used.append([part.tolist() for part in lp.split([s.num_trained_tokens for s in mb])])
        return {"logprobs": used}

    def commit(self, step: Step) -> dict[str, float | str]:
        """The weight export (gathered on every rank, written by rank 0), then the recovery snapshot."""
        start = time.perf_counter()
        self.export(Path(step.export_path))
        exported = time.perf_counter()
        self.save(step.snapshot_dir, durable=multi_node())
        return {"export_seconds": exported - start, "snapshot_seconds": time.perf_counter() - exported}

    # ------------------------------------------------------------- state
    def export(self, path: Path) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.lm, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank == 0:  # untied, by the one rule (weights/io.py): vLLM and the embedded engine read it
            write_safetensors(untie(cast(dict[str, torch.Tensor], state)), path)  # a full state dict: tensors

    def _state(self) -> dict[str, dict]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state}

    def save(self, path: str, durable: bool = True) -> None:
        """This rank's shard of model and optimizer, by ``torch.distributed.checkpoint``, written by several
        threads (``snapshot_writer_threads``). ``durable``: the files are synced to disk, for a run's checkpoint
        (it must outlive the machine) and for the recovery snapshot of a group over several nodes (a node that
        reboots must find its shard). A one-node group's recovery snapshot after each step only has to outlive a
        rank (the group restarts from it on the same machine, on /dev/shm where it fits): not synced."""
        import torch.distributed.checkpoint as dcp

        writer = dcp.FileSystemWriter(path, sync_files=durable, thread_count=snapshot_writer_threads())
        dcp.save(self._state(), storage_writer=writer)

    def load(self, path: str) -> None:
        """Load a sharded checkpoint written by any number of ranks (DCP reshards to this group's layout)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._state()
        dcp.load(state, checkpoint_id=path)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def snapshot_writer_threads() -> int:
    """Writer threads per rank for a checkpoint: this node's cores shared by its ranks, at most 8."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(8, (os.cpu_count() or 1) // max(1, local_ranks)))


def multi_node() -> bool:
    """Whether this rank's group spans several nodes (torchrun's world is larger than this node's share)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


# ----------------------------------------------------------------- process plumbing
def _die_with_parent() -> None:
    """SIGKILL this rank when its torchrun agent dies (torchrun puts ranks in their own sessions, so killing the
    agent's process group would not reach them); exit at once if it is already gone."""
    die_with_parent(signal.SIGKILL)
    if os.getppid() == 1:
        os._exit(1)


def _connect(address: tuple[str, int], authkey: bytes, timeout_s: float) -> Connection:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Client(address, family="AF_INET", authkey=authkey)
        except (ConnectionRefusedError, ConnectionResetError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _parse_endpoint(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not (sep and host and port.isdigit()):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


def run_command(conn: Connection, trainer: RankTrainer, rank: int, cmd: object) -> None:
    """Run one command and answer it (a step answers twice: trained, then committed)."""
    if isinstance(cmd, Step):
        conn.send(Done(rank, "trained", trainer.train(cmd)))
        conn.send(Done(rank, "committed", trainer.commit(cmd)))
    elif isinstance(cmd, Score):
        conn.send(Done(rank, "scored", trainer.score(cmd)))
    elif isinstance(cmd, Save):
        trainer.save(cmd.path)
        conn.send(Done(rank, "saved"))
    elif isinstance(cmd, Load):
        trainer.load(cmd.path)
        conn.send(Done(rank, "loaded"))
    else:
        raise TypeError(f"unexpected command {type(cmd).__name__}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--control", type=_parse_endpoint, required=True, help="the parent's HOST:PORT")
    parser.add_argument("--connect-timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    if "RANK" not in os.environ or TOKEN_ENV not in os.environ:
        sys.exit(f"run this under torch.distributed.run with {TOKEN_ENV} set (see docs/distributed.md)")
    _die_with_parent()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    code = 1
    conn: Connection | None = None
    kind = "connect"
    try:
        conn = _connect(args.control, os.environ[TOKEN_ENV].encode(), args.connect_timeout)
        conn.send(Hello(rank, world, local_rank, socket.gethostname(), os.getpid()))
        kind = "init"
        init = conn.recv()
        if not isinstance(init, Init):
            raise TypeError(f"expected Init, got {type(init).__name__}")
        trainer = RankTrainer(init, rank, world, local_rank)
        conn.send(Done(rank, "ready", {"micro_batch_tokens": trainer.micro_batch_tokens}))
        while True:
            kind = "wait"
            cmd = conn.recv()
            kind = type(cmd).__name__.lower()
            if isinstance(cmd, Shutdown):
                break
            run_command(conn, trainer, rank, cmd)
        code = 0
    except (EOFError, ConnectionError):
        print(f"rank {rank}: the parent closed the connection during {kind}; exiting", file=sys.stderr)
    except BaseException as exc:  # report, then exit: the parent restarts the group
        traceback.print_exc()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.send(Failed(rank, kind, f"{type(exc).__name__}: {exc}"))
    finally:
        if code == 0 and dist.is_initialized():
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # see docs/architecture.md (Trainer group): ranks can abort at interpreter exit otherwise


if __name__ == "__main__":
    main()
