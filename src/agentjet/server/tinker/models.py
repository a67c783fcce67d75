"""The registry of Tinker training clients: each one LoRA adapter of the served base, with its request order, and
the learner-side calls on it (``forward_backward``, ``optim_step``: ``learners/tinker_ops.py``)."""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from agentjet.engines.base import AdapterSet
from agentjet.learners.inprocess import InProcessLearner
from agentjet.learners.tinker_ops import FwdBwdResult, TinkerDatum, check_batch, forward_backward, optim_step
from agentjet.protocol import TinkerClientStatus
from agentjet.server.tinker.errors import TinkerError
from agentjet.server.tinker.futures import SeqOrder
from agentjet.server.tinker.runs import TrainingRuns
from agentjet.server.tinker.sessions import Session, Sessions

log = logging.getLogger(__name__)


@dataclass
class TinkerModel:
    """One Tinker training client: its adapter on the served base and its request order."""

    model_id: str
    session_id: str
    adapter: str
    rank: int
    base_model: str
    unembed: bool = False  # LoRA on the output layer too (the SDK's train_unembed)
    order: SeqOrder = field(default_factory=SeqOrder)
    steps: int = 0  # optim_step calls done
    forward_backward_calls: int = 0
    last_loss: float | None = None  # the latest forward_backward's loss (a sum over tokens)

    def status(self) -> TinkerClientStatus:
        return TinkerClientStatus(
            session_id=self.session_id, rank=self.rank, steps=self.steps,
            forward_backward_calls=self.forward_backward_calls,
            last_loss=self.last_loss if self.last_loss is not None and math.isfinite(self.last_loss) else None)


class TinkerModels:
    """The training clients by model id, on the served base's adapters (None: this server has none)."""

    def __init__(self, adapters: AdapterSet | None, sessions: Sessions, runs: TrainingRuns, *, served_name: str,
                 model_path: str, ids: Iterator[int]) -> None:
        self.adapters = adapters
        self.sessions = sessions
        self.runs = runs
        self.served_name = served_name
        self.model_path = model_path
        self.ids = ids  # one counter for every name the service makes (adapters, snapshots)
        self.live: dict[str, TinkerModel] = {}

    def new_name(self, prefix: str) -> str:
        return f"{prefix}-{next(self.ids)}-{uuid.uuid4().hex[:8]}"

    def check_base(self, base_model: str | None) -> None:
        if base_model not in (self.served_name, self.model_path):
            raise TinkerError(f"base model {base_model!r} is not served here: this server serves "
                              f"{self.served_name!r}")

    def need_adapters(self, what: str = "sampling clients") -> AdapterSet:
        if self.adapters is None:
            raise TinkerError(f"{what} need LoRA adapters on this server: start it with --lora-rank N")
        return self.adapters

    async def create(self, session_id: str, base_model: str, rank: int | None, flags: dict[str, bool],
                     metadata: dict[str, str] | None = None) -> TinkerModel:
        session = self.sessions.get(session_id)
        self.check_base(base_model)
        if self.adapters is None:
            raise TinkerError("this server fine-tunes all weights for its swarm: Tinker training clients need LoRA "
                              "adapters; start it with --lora-rank N (and --adapters NAME for the swarm's own)")
        if rank is None:
            raise TinkerError("only LoRA training clients are served: create_lora_training_client(rank=...)")
        refused = [k for k in ("train_mlp", "train_attn") if not flags.get(k, True)]
        if refused:
            raise TinkerError(f"{', '.join(refused)}=False is not supported: adapters here train every LoRA target "
                              "module of the served base (leave these flags at True)")
        if not 1 <= rank <= 1024:
            raise TinkerError(f"LoRA rank {rank} is out of range (1..1024)")
        mid = self.new_name("tinker")
        unembed = flags.get("train_unembed", True)  # the SDK's default: LoRA on the output layer too
        try:
            await self.adapters.add(mid, rank, unembed=unembed)
        except ValueError as exc:  # the engine's refusal (vLLM: no LoRA on the output layer)
            raise TinkerError(str(exc)) from exc
        return self.adopt(TinkerModel(mid, session_id, mid, rank, base_model, unembed), session, metadata)

    def adopt(self, model: TinkerModel, session: Session, metadata: dict[str, str] | None) -> TinkerModel:
        """A training client on an adapter that exists, listed in (and freed with) its session; its training run
        recorded (``runs.py``)."""
        self.live[model.model_id] = model
        session.models.append(model.model_id)
        self.runs.record(model.adapter, model.model_id, model.base_model, model.rank, metadata)
        return model

    def run_id(self, model_or_run_id: str) -> str:
        """A training run's id: a live client's adapter for its model id; anything else is taken as a run id."""
        model = self.live.get(model_or_run_id)
        return model.adapter if model is not None else model_or_run_id

    def get(self, model_id: str) -> TinkerModel:
        m = self.live.get(model_id)
        if m is None:
            raise TinkerError(f"unknown model id {model_id!r}: create a training client first", 404)
        return m

    def learner(self, model: TinkerModel) -> InProcessLearner:
        if self.adapters is None or model.adapter not in self.adapters.names():
            raise TinkerError(f"model {model.model_id!r} has no adapter any more (its session ended)", 404)
        learner = self.adapters.engine(model.adapter).learner
        if not isinstance(learner, InProcessLearner):
            raise TinkerError("Tinker training needs the in-process learner", 400)
        return learner

    async def forward_backward(self, model: TinkerModel, data: list[TinkerDatum], loss_fn: str,
                               config: dict[str, float], backward: bool) -> FwdBwdResult:
        learner = self.learner(model)
        check_batch(data, loss_fn, int(learner.policy.causal_lm.get_output_embeddings().weight.shape[0]), config)
        result = await learner.worker.run(forward_backward, learner, data, loss_fn, config, backward)
        if backward:
            model.forward_backward_calls += 1
            model.last_loss = result.loss_sum
        return result

    async def optim_step(self, model: TinkerModel, adam: dict[str, Any]) -> dict[str, Any]:
        learner = self.learner(model)
        metrics = await learner.worker.run(optim_step, learner, adam)
        model.steps += 1
        return {"type": "optim_step", "metrics": metrics}

    async def drop(self, model_id: str) -> None:
        """The training client gone: its adapter freed, and requests waiting for its next seq_id run (and fail)."""
        m = self.live.pop(model_id, None)
        if m is None:
            return
        if self.adapters is not None and m.adapter in self.adapters.names():
            try:
                await self.adapters.remove(m.adapter)
            except Exception:  # noqa: BLE001 - freeing is best effort; the session is gone either way
                log.exception("freeing tinker adapter %s", m.adapter)
        await m.order.release()
