"""The parent side of a trainer group: starts the ranks under torchrun, hands them each batch, collects the
step's metrics and the exported weights, and restarts the group after a fault (see docs/architecture.md,
"Trainer group").

A step is applied exactly once or not at all. The ranks train, rank 0 exports the new weights, and every rank
writes its shard of model and optimizer to a recovery snapshot; only then does :meth:`TrainerGroup.train_step`
return. Any failure before that (a rank that dies, reports an error or misses a deadline) raises a
:class:`TrainerGroupError`: the group is killed and restarted from the previous snapshot, so the caller can
keep the batch's episodes pending and train them again later without training anything twice.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agentjet.distributed.launch import torchrun_command
from agentjet.distributed.messages import TOKEN_ENV, Command, Done, Init, Load, Save, Score, Shutdown, Step
from agentjet.distributed.plan import check_batch, plan_step
from agentjet.distributed.ranks import GroupTimeout, RankChannel, RankFailure, TrainerGroupError
from agentjet.engines.base import StepOutput, TrainSample
from agentjet.engines.memory import CPU_MICRO_BATCH_TOKENS
from agentjet.learners.policy_step import StepConfig
from agentjet.models import resolve_model
from agentjet.runtime.proc import Child
from agentjet.settings import LearnerGroupSettings, LossSettings
from agentjet.weights.io import WEIGHTS_FILE, prune_versions, version_dir
from agentjet.weights.shm import dir_bytes, shm_dir

log = logging.getLogger(__name__)

SHARDED_DIR = "sharded"  # the torch.distributed.checkpoint directory inside a saved checkpoint
GROUP_STATE = "trainer_group.json"
KEEP_EXPORTS = 2  # exported versions kept: the one a generator may still be loading or serving, and the newest


class GroupState(enum.StrEnum):
    STOPPED = "stopped"  # no ranks yet
    STARTING = "starting"
    READY = "ready"
    BUSY = "busy"
    FAILED = "failed"  # killed after a fault and not running; the next call starts it again
    CLOSED = "closed"


def _device_and_backend(settings: LearnerGroupSettings) -> tuple[str, str]:
    device = settings.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = settings.backend if settings.backend != "auto" else ("nccl" if device == "cuda" else "gloo")
    return device, backend


SHM_OWNER = "group"  # its /dev/shm directories: agentjet-group-<kind>-<pid of the owning server>-<random>


class TrainerGroup:
    """``settings.world_size`` FSDP2 ranks training ``model``; :meth:`train_step` is a blocking call (run it off
    the event loop). Thread-safe: calls are serialised."""

    def __init__(self, model: str | Path, settings: LearnerGroupSettings, step_config: StepConfig) -> None:
        self.model = str(resolve_model(str(model)))
        self.settings = settings
        if self.settings.procs < 1:
            raise ValueError("a trainer group needs at least one rank (learner.group.procs >= 1)")
        self.config = step_config
        self.device, self.backend = _device_and_backend(self.settings)
        self.policy_version = 0
        self.micro_batch_tokens = step_config.micro_batch_tokens or CPU_MICRO_BATCH_TOKENS  # set again at start
        self.state = GroupState.STOPPED
        self.counters = {"steps": 0, "faults": 0, "restarts": 0, "failed_restarts": 0}
        self.latest_weights: Path | None = None  # the newest exported weights (``<export_dir>/vN/model.safetensors``)
        self.exit_codes: list[int | None] = []  # torchrun's exit code, per generation of the group
        self._own_work_dir = self.settings.work_dir is None
        self.work_dir = Path(self.settings.work_dir or tempfile.mkdtemp(prefix="agentjet-trainer-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        weights = dir_bytes(Path(self.model))  # as stored (fp32 or half): fp32 copies are 2-4x that
        self._own_export_dir = self.settings.export_dir is None
        self.export_dir = Path(self.settings.export_dir or shm_dir(SHM_OWNER, "weights", 4 * weights)
                               or self.work_dir / "export")
        self.export_dir.mkdir(parents=True, exist_ok=True)
        self._own_recovery_dir = self.settings.recovery_dir is None
        shm_recovery = shm_dir(SHM_OWNER, "recovery", 12 * weights) if self.settings.nnodes == 1 else None
        self.recovery_dir = Path(self.settings.recovery_dir or shm_recovery or self.work_dir / "recovery")
        self.recovery_dir.mkdir(parents=True, exist_ok=True)
        self._restore: Path | None = None  # the sharded state a (re)start loads; None: the model's own weights
        token = self.settings.auth_token
        self._token = token.get_secret_value() if token is not None else secrets.token_hex(32)
        self._lock = threading.RLock()
        self._proc: Child | None = None
        self._generation = 0
        self.channel = RankChannel(self.settings.control_host, self.settings.control_port, self._token,
                                   self.world_size, tail=lambda: log_tail(self.log_path), check=self._check_torchrun)

    # ------------------------------------------------------------ public API
    @property
    def world_size(self) -> int:
        return self.settings.world_size

    @property
    def rank_processes(self) -> list[tuple[int, str, int]]:
        """(rank, host, pid) of the running ranks."""
        return [(r.rank, r.host, r.pid) for r in self.channel.ranks]

    @property
    def log_path(self) -> Path:
        """The current generation's torchrun/rank output."""
        return self.work_dir / f"ranks-{self._generation}.log"

    def start(self) -> None:
        """Start the ranks (idempotent). Raises :class:`TrainerGroupError` if they do not come up in time."""
        with self._lock:
            self._ensure_started()

    def train_step(self, batch: list[TrainSample]) -> StepOutput:
        """One step over ``batch`` split across the ranks. On success the new weights are in
        :attr:`latest_weights`; on :class:`TrainerGroupError` nothing was applied."""
        check_batch(batch, loss=self.config.loss)
        with self._lock:
            self._ensure_started()
            plan = plan_step(batch, self.world_size, self.micro_batch_tokens, loss=self.config.loss)
            version = self.policy_version + 1
            export = version_dir(self.export_dir, version) / WEIGHTS_FILE
            snapshot = self.recovery_dir / f"v{version:06d}-g{self._generation}"
            if snapshot.exists():
                shutil.rmtree(snapshot)
            self.state = GroupState.BUSY
            started = time.monotonic()
            try:
                self.channel.send_all(lambda r: Step(version, self.config, plan.shares[r], plan.n_micro,
                                              plan.total_weight, str(export), str(snapshot)),
                               started + self.settings.step_timeout_s, "step")
                trained = self.channel.gather("trained", started + self.settings.step_timeout_s)
                trained_at = time.monotonic()
                committed = self.channel.gather("committed", trained_at + self.settings.push_timeout_s)
            except TrainerGroupError as exc:
                self._fault(exc)
                shutil.rmtree(snapshot, ignore_errors=True)  # what the failed step may have half written
                shutil.rmtree(export.parent, ignore_errors=True)
                raise
            self.state = GroupState.READY
            self._advance(version, snapshot, export)
            logprobs = plan.gather([d.info.pop("trainer_logprobs") for d in trained], len(batch))
            metrics = {k: float(v) for k, v in trained[0].info.items()}
            commit = {k: max(float(d.info[k]) for d in committed) for k in committed[0].info}
            return StepOutput({**metrics, **commit, "samples": float(len(batch)), "ranks": float(self.world_size),
                               "micro_batches": float(plan.n_micro), "group_step_seconds": trained_at - started,
                               "push_seconds": time.monotonic() - trained_at, "policy_version": float(version)},
                              logprobs)

    def score(self, samples: list[TrainSample]) -> list[list[float]]:
        """Logprobs of each sample's trained tokens under the current weights (no update), split across the
        ranks like a step."""
        check_batch(samples, need_trained_tokens=False)
        with self._lock:
            self._ensure_started()
            plan = plan_step(samples, self.world_size, self.micro_batch_tokens, need_trained_tokens=False)
            done = self._command(lambda r: Score(plan.shares[r], plan.n_micro), "scored")
        return plan.gather([d.info["logprobs"] for d in done], len(samples))

    @property
    def learning_rate(self) -> float:
        return self.config.learning_rate

    def set_learning_rate(self, lr: float) -> None:
        """Takes effect at the next step (each step carries its config to the ranks)."""
        self.config = self.config.with_learning_rate(lr)

    def set_loss(self, loss: LossSettings) -> None:
        """Takes effect at the next step. A KL penalty needs the reference model the ranks build at start only
        when ``kl_coef`` > 0 then: turning it on later takes effect at the group's next (re)start."""
        self.config = self.config.with_loss(loss)

    def save(self, path: Path) -> Path:
        """A sharded checkpoint (``torch.distributed.checkpoint``) of model and optimizer under ``path/sharded``,
        loadable by a group of any size. ``path`` must be reachable from every node."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        target = path / SHARDED_DIR
        with self._lock:
            self._ensure_started()
            if target.exists():
                shutil.rmtree(target)
            self._command(lambda _: Save(str(target)), "saved")
            state = {"policy_version": self.policy_version, "world_size": self.world_size, "model": self.model}
            (path / GROUP_STATE).write_text(json.dumps(state, indent=2))
        return path

    def load(self, path: Path) -> None:
        """Load a checkpoint written by :meth:`save` with any number of ranks (it is resharded)."""
        path = Path(path)
        target = path / SHARDED_DIR
        if not (target / ".metadata").exists():
            raise FileNotFoundError(f"no sharded trainer-group checkpoint in {path} (expected {target})")
        version = int(json.loads((path / GROUP_STATE).read_text())["policy_version"]) \
            if (path / GROUP_STATE).exists() else self.policy_version
        with self._lock:
            self._set_restore(target)  # also the recovery point if the load itself fails
            self.policy_version = version
            if self.state in (GroupState.READY, GroupState.BUSY):
                self._command(lambda _: Load(str(target)), "loaded")

    def load_hf_weights(self, path: Path, policy_version: int) -> None:
        """Start over from a Hugging Face model directory (a checkpoint of the single-process engine, say): the
        weights are loaded, the optimizer starts fresh. Restarts the ranks if they are running."""
        path = Path(path)
        if not ((path / "config.json").exists() and any(path.glob("*.safetensors"))):
            raise FileNotFoundError(f"{path} is not a Hugging Face model directory (config.json, *.safetensors)")
        with self._lock:
            self._set_restore(None)
            self.model, self.policy_version = str(path), policy_version
            if self.state in (GroupState.READY, GroupState.BUSY, GroupState.FAILED):
                self._shutdown()
                self._start()

    def close(self) -> None:
        """Shut the ranks down (cleanly if they answer) and remove what this group created."""
        with self._lock:
            if self.state is GroupState.CLOSED:
                return
            self._shutdown()
            self.channel.stop()
            self.state = GroupState.CLOSED
            if self._own_export_dir:
                shutil.rmtree(self.export_dir, ignore_errors=True)
            if self._own_recovery_dir:
                shutil.rmtree(self.recovery_dir, ignore_errors=True)
            if self._own_work_dir:
                shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> TrainerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ lifecycle
    def _ensure_started(self) -> None:
        if self.state is GroupState.CLOSED:
            raise TrainerGroupError("the trainer group is closed")
        if self.state in (GroupState.READY, GroupState.BUSY):
            return
        self._start()

    def _start(self) -> None:
        s = self.settings
        address = self.channel.address()
        self.channel.drop_stale()
        self._generation += 1
        self.state = GroupState.STARTING
        env = {**os.environ, TOKEN_ENV: self._token}
        if s.threads_per_rank:
            env["OMP_NUM_THREADS"] = str(s.threads_per_rank)
        if s.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = s.cuda_visible_devices
        cmd = torchrun_command(procs=s.procs, nnodes=s.nnodes, node_rank=s.node_rank, rdzv_endpoint=s.rdzv_endpoint,
                               control=f"{address[0]}:{address[1]}")
        self._proc = Child.spawn(cmd, self.log_path, env=env, append=False)
        log.info("trainer group %d: %d ranks starting (%s, %s), restore=%s", self._generation, self.world_size,
                 self.device, self.backend, self._restore)
        deadline = time.monotonic() + s.startup_timeout_s
        try:
            self.channel.accept(deadline, s.startup_timeout_s)
            restore = str(self._restore) if self._restore is not None else None
            init = Init(self.model, self.config, self.device, self.backend, s.mixed_precision,
                        s.gradient_checkpointing, s.collective_timeout_s, s.threads_per_rank, restore)
            self.channel.send_all(lambda _: init, deadline, "init")
            ready = self.channel.gather("ready", deadline)
        except TrainerGroupError:
            self._kill()
            self.state = GroupState.FAILED
            raise
        # unset, the micro-batch is what the tightest rank's free memory holds (each rank sized it at its start)
        self.micro_batch_tokens = self.config.micro_batch_tokens or min(
            int(d.info["micro_batch_tokens"]) for d in ready)
        self.state = GroupState.READY
        log.info("trainer group %d: ready in %.1f s", self._generation,
                 time.monotonic() - deadline + s.startup_timeout_s)

    def _fault(self, exc: TrainerGroupError) -> None:
        """Kill the group and start it again from the last recovery point."""
        self.counters["faults"] += 1
        log.error("trainer group %d failed: %s; restarting from %s", self._generation, exc,
                  self._restore or "the initial weights")
        self._kill()
        self.state = GroupState.FAILED
        try:
            self._start()
            self.counters["restarts"] += 1
            exc.restarted = True
        except TrainerGroupError as again:
            self.counters["failed_restarts"] += 1
            log.error("trainer group restart failed (the next call tries again): %s", again)

    def _advance(self, version: int, snapshot: Path, export: Path) -> None:
        """The step is committed: its snapshot becomes the recovery point; older snapshots and exports go."""
        self._set_restore(snapshot)
        self.policy_version = version
        self.latest_weights = export
        self.counters["steps"] += 1
        prune_versions(self.export_dir, KEEP_EXPORTS, {export.parent})

    def _set_restore(self, target: Path | None) -> None:
        """A new recovery point; the previous one goes if it is one of this group's snapshots."""
        previous, self._restore = self._restore, target
        if previous is not None and previous != target and previous.parent == self.recovery_dir:
            shutil.rmtree(previous, ignore_errors=True)

    def _shutdown(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None and self.state in (GroupState.READY, GroupState.BUSY):
            try:
                self.channel.send_all(lambda _: Shutdown(), time.monotonic() + self.settings.shutdown_timeout_s, "shutdown")
                if proc.wait(self.settings.shutdown_timeout_s) is None:
                    raise GroupTimeout(f"torchrun still runs {self.settings.shutdown_timeout_s:.0f} s after shutdown")
            except TrainerGroupError as exc:
                log.warning("trainer group did not shut down cleanly: %s", exc)
        self._kill()

    def _kill(self) -> None:
        """End this generation: close the connections, SIGKILL torchrun's process group and every local rank."""
        self.channel.kill()
        proc, self._proc = self._proc, None
        if proc is not None:
            self.exit_codes.append(proc.kill())  # torchrun's group, and its code if it already exited

    # ------------------------------------------------------------ the ranks' output
    def _check_torchrun(self, during: str) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            raise RankFailure(f"torchrun exited with code {self._proc.returncode} while {during}{log_tail(self.log_path)}")

    def _command(self, make: Callable[[int], Command], kind: str) -> list[Done]:
        deadline = time.monotonic() + self.settings.push_timeout_s
        self.state = GroupState.BUSY
        try:
            self.channel.send_all(make, deadline, kind)
            done = self.channel.gather(kind, deadline)
        except TrainerGroupError as exc:
            self._fault(exc)
            raise
        self.state = GroupState.READY
        return done


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of the ranks' output, for an error message (empty when there is none)."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return ("\n  rank output (" + str(path) + "):\n    " + "\n    ".join(text)) if text else ""
