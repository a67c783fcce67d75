"""The fleet layout: N generator replicas behind the server's router (``generators/fleet``), joined to one learner
by the fleet's seam (``FleetSync``: the learner exports each version once; it is pushed to every replica in
rotation). Built when ``generator.replicas`` is not 1, replicas may join (``generator.fleet.listen``) or a Ray
cluster places them (``--ray``).

The learner keeps its own copy of the weights (the in-process learner, as with vLLM), or is a trainer group. The
replicas:
- embedded (``--engine hf``) on this machine: engine processes (``generators/hf/engine_process``:
  ``EngineProcessReplica``), each on its device (``generator.fleet.devices``) with ``generator.fleet.threads``
  torch threads;
- embedded on a Ray cluster (``--ray``): replica processes (``ajet generator``) in Ray actors on the cluster's
  nodes (``generators/fleet/ray_replicas.py``);
- embedded on machines that join by hand (``ajet generator --join``, ``generator.fleet.listen``), beside the
  server's own;
- vLLM: N managed vLLM servers on this machine (``VLLMReplica``), each with its port, work directory and GPUs
  (``generator.fleet.devices``: one CUDA_VISIBLE_DEVICES per replica); each push is probed on each.

A replica process dials the fleet's join address with its secret (``generator.fleet.token``: random unless given,
and written to ``<data_dir>/fleet.token`` when machines may join).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from pathlib import Path
from typing import Any

from agentjet.distributed.learner import GroupLearner
from agentjet.engines.base import Learner
from agentjet.engines.errors import EngineUnavailableError
from agentjet.engines.model import ModelFacts, load_policy_model, model_facts
from agentjet.files import write_atomic
from agentjet.generators.fleet import (
    FleetGenerator,
    FleetSync,
    InProcessReplica,
    Replica,
    ReplicaDown,
    Weights,
)
from agentjet.generators.fleet.remote import JoinedReplica, JoinListener
from agentjet.generators.fleet.wire import Hello, Init
from agentjet.generators.hf.build import hf_generator
from agentjet.generators.hf.engine_process import ProcessHFGenerator
from agentjet.generators.vllm import VLLMGenerator
from agentjet.generators.vllm.process import ProcessState
from agentjet.layouts.composed import ComposedEngine
from agentjet.layouts.group import start_trainer_group
from agentjet.learners.inprocess import InProcessLearner
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import EngineKind, GeneratorSettings, PlacementSettings, ServerConfig

log = logging.getLogger(__name__)

TOKEN_FILE = "fleet.token"


def hf_replica(name: str, model: str | Path, generator: GeneratorSettings | None = None,
               placement: PlacementSettings | None = None) -> InProcessReplica:
    """An embedded generator as a replica: it takes weights by copying them into its module between decode steps;
    a ping is a no-op job on its torch thread (a hung thread never runs it; a read: it keeps the kept prefixes). What a replica process serves
    (``ajet generator``), and the tests' replicas in one process."""
    gen = hf_generator(load_policy_model(model, placement), generator)

    async def ping() -> None:
        await gen.worker.read(_noop)

    return InProcessReplica(name, gen, load=gen.load_weights, ping=ping)


def _noop() -> None:
    return None


class VLLMReplica(Replica):
    """One managed vLLM server as a replica: its own process supervision; a push is its reload (full weights) or
    LoRA load, each checked by its probe against the learner. A failed probe takes it out of rotation (it is
    restarted and brought to the newest weights again) instead of halting training."""

    def __init__(self, name: str, generator: VLLMGenerator) -> None:
        self.name = name
        self._generator = generator

    @property
    def generator(self) -> VLLMGenerator:
        return self._generator

    def where(self) -> str:
        return f"vLLM at {self._generator.url} (pid {self._generator.process.pid})"

    def alive(self) -> bool:
        """Its process serves (a failed probe is a failed push instead: it takes the replica out, naming it)."""
        return self._generator.process.state is ProcessState.READY

    async def ping(self) -> None:
        if not self.alive():
            raise ReplicaDown(f"vLLM {self.name} is {self._generator.process.state.value}")

    async def start(self) -> None:
        gen = self._generator
        gen.halted_reason = None  # a restart starts from the newest weights on disk; the catch-up probes them
        await asyncio.to_thread(gen.start)
        gen.gate.set(True)

    async def load(self, weights: Weights) -> None:
        gen = self._generator
        if weights.score is None:
            raise ReplicaDown("a vLLM replica checks each push against the learner: the push carries no scorer")
        try:
            if gen.uses_lora:
                await gen.swaps.adapter(weights.path, weights.version, weights.score)
            else:
                await gen.swaps.full(weights.path, weights.version, weights.score)
        finally:
            await gen.swaps.best_effort_resume()
            gen.gate.set(True)

    async def stop(self) -> None:
        await asyncio.to_thread(self._generator.process.stop)


class EngineProcessReplica(Replica):
    """The embedded generator in an engine process of its own on this machine (``ProcessHFGenerator``), as a replica:
    started (and started again: a fresh engine process) here, brought to a version by ``load_weights`` (the
    learner's export, in ``/dev/shm`` when it has room), pinged with a control call."""

    def __init__(self, name: str, facts: ModelFacts, generator: GeneratorSettings, placement: PlacementSettings,
                 log_path: Path) -> None:
        self.name = name
        self.facts = facts
        self.settings = generator
        self.placement = placement
        self.log_path = log_path
        self._engine: ProcessHFGenerator | None = None

    @property
    def generator(self) -> ProcessHFGenerator:
        if self._engine is None:
            raise ReplicaDown(f"replica {self.name} has no engine process")
        return self._engine

    @property
    def version(self) -> int:
        return self._engine.policy_version if self._engine is not None else 0

    def where(self) -> str:
        child = self._engine.child if self._engine is not None else None
        return f"engine process {child.pid} on this machine" if child is not None else "an engine process (starting)"

    def alive(self) -> bool:
        return self._engine is not None and self._engine.alive

    async def ping(self) -> None:
        try:
            await self.generator.ping()
        except EngineUnavailableError as exc:
            raise ReplicaDown(f"replica {self.name}: {exc}") from exc

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        engine = ProcessHFGenerator(self.facts, self.settings, self.placement, log_path=self.log_path)
        self._engine = engine
        await asyncio.to_thread(engine.wait_ready)

    async def load(self, weights: Weights) -> None:
        await self.generator.load_weights(weights.path, weights.version)

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.close()


def _threads(config: ServerConfig, started: int) -> int:
    own = config.generator.fleet.threads
    if own is not None:
        return own
    return max(1, len(os.sched_getaffinity(0)) // max(started, 1))


def fleet_token(config: ServerConfig, data_dir: Path) -> str:
    """The fleet's secret: ``generator.fleet.token``, else a random one (written owner-only to
    ``<data_dir>/fleet.token`` when machines may join, for their ``--token-file``)."""
    given = ServerConfig.secret(config.generator.fleet.token)
    if given is not None:
        return given
    token = secrets.token_urlsafe(32)
    if config.generator.fleet.listen is not None:
        path = write_atomic(data_dir / TOKEN_FILE, token, mode=0o600)
        log.info("replicas join with the secret in %s (ajet generator --join ... --token-file %s)", path, path)
    return token


class Replicas:
    """What the fleet's replicas are made from: the replica process's ``Init`` and where its weights come from."""

    def __init__(self, config: ServerConfig, data_dir: Path, tokenizer: Any, started: int) -> None:
        self.config = config
        self.data_dir = data_dir
        self.tokenizer = tokenizer
        self.threads = _threads(config, started)
        gen = config.generator
        self.generator = gen.model_dump(mode="json", exclude={"fleet", "vllm", "replicas"})

    def init(self, name: str, index: int) -> Init:
        fleet, placement = self.config.generator.fleet, self.config.placement
        return Init(name=name, model=str(self.config.model), generator=self.generator,
                    device=fleet.device_of(index) or placement.device, dtype=placement.dtype, threads=self.threads)

    def weights_by_path(self, hello: Hello) -> bool:
        """A replica that sees the same files takes a push by path, else over its connection."""
        mode = self.config.generator.fleet.weights
        return mode == "shared" or (mode == "auto" and hello.host == socket.gethostname())

    def joined(self, name: str, hello: Hello) -> JoinedReplica:
        return JoinedReplica(name, self.init(name, 0), self.tokenizer, self.weights_by_path)


def _learner(config: ServerConfig, work_dir: Path) -> Learner:
    if config.learner.group.procs:
        return GroupLearner(start_trainer_group(config), model_facts(Path(config.model)))
    policy = load_policy_model(config.model, config.placement, config.learner)
    return InProcessLearner(policy, config.learner, config.loss, separate_sampler=config.generator.kind is
                            EngineKind.VLLM, export_root=work_dir / "weights",
                            keep_exports=config.generator.vllm.keep_weight_versions)


def _vllm_replicas(config: ServerConfig, work_dir: Path, learner: Learner) -> list[Replica]:
    facts = model_facts(Path(config.model))
    gen = config.generator
    start_dir = run_blocking(learner.export_weights(gen.vllm.dtype if gen.vllm.dtype != "auto" else None))
    out: list[Replica] = []
    for i in range(gen.replicas):
        v = gen.vllm.model_copy(update={"port": gen.vllm.port + i if gen.vllm.port else 0,
                                        "cuda_visible_devices": gen.fleet.device_of(i) or gen.vllm.cuda_visible_devices})
        vllm = VLLMGenerator(start_dir, facts.tokenizer, v, stop_ids=set(facts.stop_ids),
                             max_context=min(gen.max_context or facts.context_length, facts.context_length),
                             seed=gen.seed + i, work_dir=work_dir / f"vllm-r{i}", start=False)
        out.append(VLLMReplica(f"r{i}", vllm))
    return out


def fleet_engine(config: ServerConfig, data_dir: Path) -> ComposedEngine:
    """N replicas (and those that join) behind the router, one learner, the fleet's seam. Blocks until every
    replica the server starts serves (or raises, naming those that did not)."""
    gen = config.generator
    work_dir = data_dir / "fleet"
    facts = model_facts(Path(config.model))
    learner = _learner(config, work_dir)
    fleet = FleetGenerator(facts.tokenizer, min(gen.max_context or facts.context_length, facts.context_length),
                           facts.stop_ids, gen.fleet, gen.kind.value, push_timeout_s=gen.vllm.sync_timeout_s
                           if gen.kind is EngineKind.VLLM else config.learner.group.push_timeout_s)
    try:
        replicas = (_vllm_replicas(config, work_dir, learner) if gen.kind is EngineKind.VLLM
                    else _hf_replicas(config, data_dir, facts.tokenizer, fleet))
        fleet.start(replicas)
    except BaseException:
        run_blocking(fleet.close())
        raise
    seam = FleetSync(gen.vllm.sync_timeout_s if gen.kind is EngineKind.VLLM else config.learner.group.push_timeout_s,
                     probe=gen.kind is EngineKind.VLLM, transport="reload + probe" if gen.kind is EngineKind.VLLM
                     else "safetensors")
    return ComposedEngine(fleet, learner, seam)


def _hf_replicas(config: ServerConfig, data_dir: Path, tokenizer: Any, fleet: FleetGenerator) -> list[Replica]:
    """The replicas the server starts (engine processes on this machine, or replica processes as Ray actors) and
    the join listener that replica processes (Ray's, and machines joining by hand) dial."""
    f = config.generator.fleet
    parts = Replicas(config, data_dir, tokenizer, config.generator.replicas)
    if f.ray is None and f.listen is None:
        return _engine_processes(config, data_dir, parts.threads)
    token = fleet_token(config, data_dir)
    host, port = (f.listen.rsplit(":", 1) if f.listen else ("0.0.0.0", "0"))
    listener = JoinListener(host or "0.0.0.0", int(port), token, fleet.loop.loop,
                            on_new=lambda name, hello: _join(fleet, parts.joined(name, hello)))
    fleet.on_close.append(listener.close)
    log.info("generator replicas join at %s", listener.address())
    if f.ray is None:  # machines join by hand; this one starts its own as engine processes
        return _engine_processes(config, data_dir, parts.threads)
    from agentjet.generators.fleet.ray_replicas import RayPlacement

    placement = RayPlacement(f)
    fleet.on_close.append(placement.close)
    join = listener.address(placement.node_ip())
    replicas = [placement.replica(f"r{i}", parts.init(f"r{i}", i), tokenizer, parts.weights_by_path, join, token)
                for i in range(config.generator.replicas)]
    for replica in replicas:
        listener.expect(replica)
    return list(replicas)


def _engine_processes(config: ServerConfig, data_dir: Path, threads: int) -> list[Replica]:
    """``generator.replicas`` engine processes on this machine (``generators/hf/engine_process``), each on its device.
    Their torch threads: the engine processes inherit the server's environment, so ``OMP_NUM_THREADS`` is set in
    it once, for all of them (the server's own torch has its threads already)."""
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    facts = model_facts(Path(config.model))
    gen = config.generator.model_copy(update={"replicas": 1})
    return [EngineProcessReplica(f"r{i}", facts, gen, config.placement.model_copy(
        update={"device": config.generator.fleet.device_of(i) or config.placement.device}),
        data_dir / "replicas" / f"r{i}.log") for i in range(config.generator.replicas)]


def _join(fleet: FleetGenerator, replica: JoinedReplica) -> JoinedReplica:
    """A machine that joined by hand: into the fleet (on its loop), in rotation once caught up."""
    task = fleet.loop.loop.create_task(fleet.add(replica))
    task.add_done_callback(lambda t: _report_join(replica.name, t))
    return replica


def _report_join(name: str, task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("replica %s could not join: %s", name, task.exception())
