"""Sessions, models, futures and per-model ordering for the Tinker API (see ``docs/tinker.md``)."""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import math
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentjet.engines.base import AdapterSet, FinishReason, SamplingParams
from agentjet.engines.errors import GenerationError
from agentjet.learners.inprocess import InProcessLearner
from agentjet.learners.tinker_ops import (
    FwdBwdResult,
    TinkerDatum,
    check_batch,
    checkpoint_shape,
    copy_adapter,
    forward_backward,
    load_adapter_state,
    optim_step,
    prompt_logprobs,
    save_adapter_state,
)
from agentjet.protocol import TinkerClientStatus, TinkerStatus
from agentjet.runtime.clock import Clock

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
_STATE_PATH = re.compile(r"^tinker://(?P<model>[A-Za-z0-9_-]{1,100})/weights/(?P<name>[A-Za-z0-9_][A-Za-z0-9_.-]{0,99})$")

# A long poll of retrieve_future holds at most this long before answering try_again (the SDK's read timeout is 45 s).
LONG_POLL_S = 30.0
FUTURE_KEEP_S = 600.0  # a finished future nobody retrieved is dropped this long after it finished (server clock)


class TinkerError(Exception):
    """A refusal the SDK can act on: an HTTP status (4xx only) and a message; or, inside a future, a failed
    result with a category (``user`` for bad input, ``server`` for the server's own faults)."""

    def __init__(self, message: str, status: int = 400, category: str = "user") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.category = category


@dataclass
class Session:
    session_id: str
    last_seen: float
    tags: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)


@dataclass
class TinkerModel:
    """One Tinker training client: its adapter on the served base and its request order."""

    model_id: str
    session_id: str
    adapter: str
    rank: int
    base_model: str
    unembed: bool = False  # LoRA on the output layer too (the SDK's train_unembed)
    next_seq: int | None = None  # the seq_id the next request must carry (None: the first sets it)
    turn: asyncio.Condition = field(default_factory=asyncio.Condition)
    steps: int = 0  # optim_step calls done
    forward_backward_calls: int = 0
    last_loss: float | None = None  # the latest forward_backward's loss (a sum over tokens)


@dataclass
class Sampler:
    """A sampling session: the adapter it samples (a frozen snapshot of a training client, or the base)."""

    sampler_id: str
    adapter: str
    base_model: str
    model_path: str | None = None
    owner: str | None = None  # the training client it snapshots


@dataclass
class SampledSequence:
    tokens: list[int]
    logprobs: list[float]
    stop: bool
    topk: list[list[tuple[int, float]]] | None = None  # per sampled token, the k likeliest (topk_sample_logprobs)


@dataclass
class SampleResult:
    sequences: list[SampledSequence]
    prompt_logprobs: list[float] | None  # len(prompt) values, the first NaN


# unnamed snapshots (save_weights_and_get_sampling_client) kept per training client; older ones are freed
KEEP_SNAPSHOTS = 4
BASE_ADAPTER = "tinker-base"  # a rank-1 adapter at zero: the base's outputs, for create_sampling_client(base_model)


@dataclass
class Future:
    request_id: str
    model_id: str | None
    seq_id: int | None = None  # its place in its model's order (None: runs at once)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: Any = None  # a JSON-able dict, or protobuf bytes
    error: TinkerError | None = None
    finished_at: float | None = None  # the server clock when it finished


class TinkerService:
    def __init__(self, *, key: str, served_name: str, model_path: str, adapters: AdapterSet | None,
                 base_rank: int, max_context: int | None, clock: Clock, data_dir: Path,
                 lease_seconds: float = 120.0) -> None:
        self.data_dir = data_dir / "tinker"  # tinker://<model id>/weights/<name> lives in <model id>/<name>.pt
        self._key = key.encode()
        self.served_name = served_name
        self.model_path = model_path
        self.adapters = adapters
        self.base_rank = base_rank
        self.max_context = max_context
        self.clock = clock
        self.lease_seconds = lease_seconds
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, TinkerModel] = {}
        self.futures: dict[str, Future] = {}
        self.samplers: dict[str, Sampler] = {}
        self.paths: dict[str, str] = {}  # tinker://... sampler path -> sampler id
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ auth
    def key_ok(self, key: str | None) -> bool:
        return key is not None and hmac.compare_digest(key.encode(), self._key)

    # ------------------------------------------------------------------ sessions
    def create_session(self, tags: list[str]) -> Session:
        self.expire()
        sid = f"session-{uuid.uuid4().hex[:12]}"
        self.sessions[sid] = s = Session(sid, self.clock.monotonic(), list(tags))
        return s

    def session(self, session_id: str) -> Session:
        s = self.sessions.get(session_id)
        if s is None:
            raise TinkerError(f"unknown session {session_id!r} (expired, finished or never created)", 404)
        return s

    def heartbeat(self, session_id: str) -> None:
        self.expire()
        self.session(session_id).last_seen = self.clock.monotonic()

    async def finish(self, session_id: str) -> None:
        s = self.sessions.pop(session_id, None)
        if s is not None:
            for mid in s.models:
                await self._drop_model(mid)

    def expire(self) -> list[str]:
        """Sessions past their lease (no heartbeat for ``lease_seconds`` on the server's clock): dropped, their
        models' adapters freed (in the background). Finished futures nobody retrieved for ``FUTURE_KEEP_S``
        are dropped too (a client that died between submitting and retrieving would otherwise keep them)."""
        now = self.clock.monotonic()
        gone = [sid for sid, s in self.sessions.items() if now - s.last_seen > self.lease_seconds]
        for sid in gone:
            self._spawn(self.finish(sid))
            log.info("tinker session %s expired", sid)
        stale = [rid for rid, f in list(self.futures.items())
                 if f.finished_at is not None and now - f.finished_at > FUTURE_KEEP_S]
        for rid in stale:
            self.futures.pop(rid, None)
        return gone

    def status(self) -> TinkerStatus:
        """Sessions and training clients, for the run's snapshot (the status, the dashboard, Prometheus). It may
        run in a worker thread: the dicts the event loop changes are copied in one call before they are read."""
        models = list(self.models.values())
        return TinkerStatus(
            sessions=len(self.sessions), sampling_clients=len(self.samplers),
            training_clients={m.model_id: TinkerClientStatus(
                session_id=m.session_id, rank=m.rank, steps=m.steps, forward_backward_calls=m.forward_backward_calls,
                last_loss=m.last_loss if m.last_loss is not None and math.isfinite(m.last_loss) else None)
                for m in models})

    # ------------------------------------------------------------------ models
    async def create_model(self, session_id: str, base_model: str, rank: int | None,
                           flags: dict[str, bool]) -> TinkerModel:
        session = self.session(session_id)
        if base_model not in (self.served_name, self.model_path):
            raise TinkerError(f"base model {base_model!r} is not served here: this server serves "
                              f"{self.served_name!r}")
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
        mid = f"tinker-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        unembed = flags.get("train_unembed", True)  # the SDK's default: LoRA on the output layer too
        try:
            await self.adapters.add(mid, rank, unembed=unembed)
        except ValueError as exc:  # the engine's refusal (vLLM: no LoRA on the output layer)
            raise TinkerError(str(exc)) from exc
        model = TinkerModel(mid, session_id, mid, rank, base_model, unembed)
        self.models[mid] = model
        session.models.append(mid)
        return model

    def model(self, model_id: str) -> TinkerModel:
        m = self.models.get(model_id)
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
        check_batch(data, loss_fn, int(learner.policy.causal_lm.get_output_embeddings().weight.shape[0]))
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

    # ------------------------------------------------------------------ sampling
    def _need_adapters(self) -> AdapterSet:
        if self.adapters is None:
            raise TinkerError("sampling clients need LoRA adapters on this server: start it with --lora-rank N")
        return self.adapters

    async def save_for_sampler(self, model: TinkerModel, name: str | None) -> dict[str, Any]:
        """A frozen snapshot of the client's adapter as an adapter of its own (later steps leave it as it is)."""
        adapters = self._need_adapters()
        learner = self.learner(model)
        snap = f"snap-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        await adapters.add(snap, model.rank, unembed=model.unembed)
        await learner.worker.run(copy_adapter, learner, model.adapter, snap)
        path = f"tinker://{model.adapter}/sampler_weights/{name}" if name else None
        sampler = Sampler(f"sampler-{snap}", snap, model.base_model, path, model.model_id)
        self.samplers[sampler.sampler_id] = sampler
        if path is not None:
            old = self.paths.get(path)
            self.paths[path] = sampler.sampler_id
            if old is not None:
                await self._drop_sampler(old)
        else:
            mine = [x for x in self.samplers.values() if x.owner == model.model_id and x.model_path is None]
            for stale in mine[:-KEEP_SNAPSHOTS]:
                await self._drop_sampler(stale.sampler_id)
        return {"type": "save_weights_for_sampler", "path": path, "sampling_session_id": sampler.sampler_id}

    async def _drop_sampler(self, sampler_id: str) -> None:
        sampler = self.samplers.pop(sampler_id, None)
        if sampler is not None and self.adapters is not None and sampler.adapter in self.adapters.names():
            await self.adapters.remove(sampler.adapter)

    async def create_sampler(self, model_path: str | None, base_model: str | None) -> Sampler:
        if model_path:
            sid = self.paths.get(model_path)
            if sid is None:
                raise TinkerError(f"unknown sampler path {model_path!r}: save_weights_for_sampler(name) first", 404)
            return self.samplers[sid]
        if base_model not in (self.served_name, self.model_path):
            raise TinkerError(f"base model {base_model!r} is not served here: this server serves "
                              f"{self.served_name!r}")
        adapters = self._need_adapters()
        if BASE_ADAPTER not in adapters.names():
            await adapters.add(BASE_ADAPTER, 1)
        sampler = Sampler(f"sampler-base-{uuid.uuid4().hex[:8]}", BASE_ADAPTER, self.served_name)
        self.samplers[sampler.sampler_id] = sampler
        return sampler

    def sampler(self, sampler_id: str) -> Sampler:
        s = self.samplers.get(sampler_id)
        if s is None:
            raise TinkerError(f"unknown sampling session {sampler_id!r} (freed: a training client keeps its last "
                              f"{KEEP_SNAPSHOTS} unnamed snapshots)", 404)
        return s

    async def sample(self, sampler: Sampler, prompt: list[int], num_samples: int, params: SamplingParams,
                     want_prompt_logprobs: bool, last_n: int | None = None) -> SampleResult:
        adapters = self._need_adapters()
        if sampler.adapter not in adapters.names():
            raise TinkerError(f"sampling session {sampler.sampler_id!r} was freed", 404)
        engine = adapters.engine(sampler.adapter)
        vocab = len(engine.tokenizer)
        if not prompt or any(not 0 <= t < vocab for t in prompt):
            raise TinkerError(f"the prompt must be non-empty token ids in 0..{vocab - 1}")
        seeds = [None if params.seed is None else (params.seed + i) % (2**31) for i in range(num_samples)]
        from dataclasses import replace

        try:
            # routed by the sampling client, as an episode's calls are by their episode (a fleet of replicas)
            results = await asyncio.gather(*(engine.generate(prompt, replace(params, seed=seed), adapter=sampler.adapter,
                                                             session=sampler.sampler_id)
                                              for seed in seeds))
        except GenerationError as e:
            raise TinkerError(str(e)) from e
        plp: list[float] | None = None
        if want_prompt_logprobs:
            learner = engine.learner
            if not isinstance(learner, InProcessLearner):
                raise TinkerError("prompt logprobs need the in-process learner")
            plp = [math.nan, *await learner.worker.run(prompt_logprobs, learner, prompt)]
            if last_n is not None:
                plp = [math.nan if i < len(plp) - last_n else x for i, x in enumerate(plp)]
        return SampleResult([SampledSequence(
            list(r.token_ids), list(r.logprobs), r.finish_reason is FinishReason.STOP,
            [list(top) for top in r.top_logprobs] if params.top_logprobs and r.top_logprobs is not None else None)
            for r in results], plp)

    # ------------------------------------------------------------------ checkpoints
    def _state_file(self, path: str) -> Path:
        m = _STATE_PATH.match(path)
        if m is None:
            raise TinkerError(f"{path!r} is not a checkpoint path of this server (tinker://<model id>/weights/<name>)")
        return self.data_dir / m["model"] / f"{m['name']}.pt"

    async def save_state(self, model: TinkerModel, name: str) -> dict[str, Any]:
        if not _NAME.match(name):
            raise TinkerError("a checkpoint name is letters, digits, _ . and - (at most 100)")
        learner = self.learner(model)
        path = f"tinker://{model.adapter}/weights/{name}"  # the adapter's name: a path segment (a model id may not be)
        await learner.worker.run(save_adapter_state, learner, self._state_file(path))
        return {"type": "save_weights", "path": path}

    async def load_state(self, model: TinkerModel, path: str, optimizer: bool) -> dict[str, Any]:
        file = self._state_file(path)
        if not file.is_file():
            raise TinkerError(f"no checkpoint at {path!r}", 404)
        learner = self.learner(model)
        await learner.worker.run(load_adapter_state, learner, file, optimizer)
        return {"type": "load_weights", "path": path, "model_id": model.model_id}

    async def create_from_state(self, session_id: str, model_seq_id: int, path: str, optimizer: bool,
                                base_model: str | None) -> TinkerModel:
        """``create_training_client_from_state[_with_optimizer]``: a new training client of the saved state's rank,
        loaded from it. Its model id is the one the SDK derives, ``<session id>:train:<model_seq_id>``."""
        session = self.session(session_id)
        if base_model is not None and base_model not in (self.served_name, self.model_path):
            raise TinkerError(f"base model {base_model!r} is not served here: this server serves "
                              f"{self.served_name!r}")
        file = self._state_file(path)
        if not file.is_file():
            raise TinkerError(f"no checkpoint at {path!r}", 404)
        adapters = self._need_adapters()
        mid = f"{session_id}:train:{model_seq_id}"
        if mid in self.models:
            raise TinkerError(f"model {mid!r} exists already (model_seq_id {model_seq_id} is taken)", 409)
        rank, unembed = await asyncio.to_thread(checkpoint_shape, file)
        adapter = f"tinker-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        await adapters.add(adapter, rank, unembed=unembed)
        model = self.models[mid] = TinkerModel(mid, session_id, adapter, rank, self.served_name, unembed)
        session.models.append(mid)
        try:
            await self.load_state(model, path, optimizer)
        except BaseException:
            await self._drop_model(mid)
            raise
        return model

    async def _drop_model(self, model_id: str) -> None:
        m = self.models.pop(model_id, None)
        for sampler in [x for x in self.samplers.values() if x.owner == model_id and x.model_path is None]:
            await self._drop_sampler(sampler.sampler_id)
        if m is not None and self.adapters is not None and m.adapter in self.adapters.names():
            try:
                await self.adapters.remove(m.adapter)
            except Exception:  # noqa: BLE001 - freeing is best effort; the session is gone either way
                log.exception("freeing tinker adapter %s", m.adapter)
        if m is not None:  # requests waiting for a seq_id that will never come now run, and fail: no adapter
            async with m.turn:
                m.next_seq = None
                m.turn.notify_all()

    # ------------------------------------------------------------------ futures
    def submit(self, model_id: str | None, work: Callable[[], Awaitable[Any]], seq_id: int | None = None) -> str:
        """Run ``work`` in the background (in ``seq_id`` order within its model) and return the request id the
        SDK polls with ``retrieve_future``."""
        rid = f"req-{uuid.uuid4().hex}"
        fut = self.futures[rid] = Future(rid, model_id, seq_id)
        self._spawn(self._run(fut, work, seq_id))
        return rid

    async def _run(self, fut: Future, work: Callable[[], Awaitable[Any]], seq_id: int | None) -> None:
        model = self.models.get(fut.model_id) if fut.model_id else None
        try:
            if model is not None and seq_id is not None:
                async with model.turn:
                    if model.next_seq is None:
                        model.next_seq = seq_id
                    await model.turn.wait_for(lambda: model.next_seq is None or seq_id <= model.next_seq)
                    try:
                        fut.result = await work()
                    finally:
                        model.next_seq = max(model.next_seq or 0, seq_id + 1)
                        model.turn.notify_all()
            else:
                fut.result = await work()
        except TinkerError as e:
            fut.error = e
        except ValueError as e:
            fut.error = TinkerError(str(e))
        except Exception as e:  # noqa: BLE001 - a fault of the server, reported in the future, not as a 5xx
            log.exception("tinker request %s failed", fut.request_id)
            fut.error = TinkerError(f"{type(e).__name__}: {e}", 500, "server")
        finally:
            fut.finished_at = self.clock.monotonic()
            fut.done.set()

    async def retrieve(self, request_id: str, wait_s: float = LONG_POLL_S) -> Future | None:
        """The finished future, or None after ``wait_s`` on the server's clock (the SDK asks again)."""
        fut = self.futures.get(request_id)
        if fut is None:
            raise TinkerError(f"unknown request id {request_id!r}", 404)
        if not fut.done.is_set():
            waiter = asyncio.ensure_future(fut.done.wait())
            timer = asyncio.ensure_future(self.clock.sleep(wait_s))
            await asyncio.wait({waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            timer.cancel()
            if not fut.done.is_set():
                return None
        return fut

    def waiting_turn(self, fut: Future) -> bool:
        """The future waits for its turn: its seq_id is ahead of its model's next one (it runs once that comes)."""
        model = self.models.get(fut.model_id) if fut.model_id else None
        return (not fut.done.is_set() and model is not None and fut.seq_id is not None
                and model.next_seq is not None and fut.seq_id > model.next_seq)

    def forget(self, request_id: str) -> None:
        self.futures.pop(request_id, None)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
