"""One frozen base, several named LoRA adapters, served by one vLLM process: ``layouts/adapters.py``'s layout
with vLLM as the generator.

vLLM starts with ``--enable-lora``, ``--max-lora-rank`` = ``generator.vllm.lora_max_rank`` and ``--max-loras`` =
``generator.vllm.max_loras``, or, when that is 0, two per adapter at start (each adapter's current versioned LoRA
plus its next one, loaded and probed before the old one is unloaded). One in-process PEFT model holds every
adapter for training (``load_policy_model(..., adapters=names)``). Per adapter, a ``ComposedEngine`` joins a view
of the vLLM generator routed to that adapter (``generators/vllm/adapters.VLLMAdapterView``: requests go to vLLM as
``<name>-v<version>``), an ``InProcessLearner`` that trains that adapter alone, and ``VLLMAdapterReload``: after
the adapter's step its export is loaded as ``<name>-v<version+1>``, probed against its learner, and the old name is
unloaded once idle. Each adapter has its own version; the others are untouched. The learners share one worker
thread (they switch the module's active adapter). A failed push halts the shared vLLM: every adapter stops.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from agentjet.engines.model import PolicyModel, add_lora_adapter, check_adapter_name, load_policy_model
from agentjet.engines.worker import EngineWorker
from agentjet.generators.vllm.adapters import VLLMAdapterReload, VLLMAdapterView
from agentjet.generators.vllm.engine import VLLMGenerator
from agentjet.layouts.composed import ComposedEngine, NamedEngines
from agentjet.learners.inprocess import InProcessLearner
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import ServerConfig
from agentjet.weights.sync import WeightSync

VLLMAdapterEngine = ComposedEngine[InProcessLearner, VLLMAdapterView]

LORAS_PER_ADAPTER = 2  # the current versioned LoRA and the next one while a push loads and probes it


def max_loras(config: ServerConfig, adapters: int) -> int:
    """vLLM's ``--max-loras``: ``generator.vllm.max_loras``, or 2 per adapter at start when that is 0."""
    return config.generator.vllm.max_loras or LORAS_PER_ADAPTER * adapters


class VLLMAdapters(NamedEngines[VLLMAdapterEngine]):
    """Several LoRA adapters on one base, served by one vLLM (an ``AdapterSet``): per adapter a ComposedEngine of
    a routed view, a learner of that adapter alone and a seam that pushes only it."""

    def __init__(self, config: ServerConfig, policy: PolicyModel, vllm: VLLMGenerator, work_dir: Path) -> None:
        self.config = config
        self.policy = policy
        self.vllm = vllm
        self.work_dir = work_dir
        self.worker = EngineWorker(name="agentjet-adapters-learner")  # one thread: the module's active adapter
        self._engines: dict[str, VLLMAdapterEngine] = {name: self._compose(name) for name in vllm.adapter_versions}

    def _learner(self, name: str) -> InProcessLearner:
        c = self.config
        return InProcessLearner(self.policy, c.learner, c.loss, separate_sampler=True, worker=self.worker,
                                export_root=self.work_dir / "adapters" / name,
                                keep_exports=c.generator.vllm.keep_weight_versions, adapter=name)

    def _compose(self, name: str, learner: InProcessLearner | None = None) -> VLLMAdapterEngine:
        seam = VLLMAdapterReload(self.config.generator.vllm, name)
        # VLLMAdapterReload serves any learner with a LoRA export: the cast states that for this pair (WeightSync's
        # type parameters are invariant)
        return ComposedEngine(VLLMAdapterView(self.vllm, name), learner or self._learner(name),
                              cast(WeightSync[InProcessLearner, VLLMAdapterView], seam))

    # ------------------------------------------------------------------ the adapters
    def check_new(self, name: str, rank: int | None) -> None:
        """Refuse an adapter vLLM could not serve: a taken or bad name, a rank above ``--max-lora-rank`` or one
        adapter more than ``--max-loras`` holds (2 per adapter), each naming the setting to change."""
        check_adapter_name(name)
        if name in self._engines:
            raise ValueError(f"adapter {name!r} exists already: the adapters are {self.names()}")
        s = self.config.generator.vllm
        r = rank or self.config.learner.lora.rank
        if r > s.lora_max_rank:
            raise ValueError(f"adapter {name!r}: rank {r} is above vLLM's --max-lora-rank {s.lora_max_rank} "
                             "(generator.vllm.lora_max_rank, fixed when vLLM started)")
        slots = self.vllm.launch.max_loras
        if LORAS_PER_ADAPTER * (len(self._engines) + 1) > slots:
            raise ValueError(f"adapter {name!r}: {len(self._engines) + 1} adapters need {LORAS_PER_ADAPTER} LoRA "
                             f"slots each, but vLLM's --max-loras is {slots} (generator.vllm.max_loras, fixed when "
                             "vLLM started)")

    async def add(self, name: str, rank: int | None = None, unembed: bool = False) -> VLLMAdapterEngine:
        """A fresh adapter (the learner's LoRA settings; its own ``rank`` when given), loaded in vLLM as
        ``<name>-v0`` and served and trained from version 0. LoRA on the output layer (``unembed``) is refused:
        this adapter path loads LoRA on the decoder's linear layers only."""
        if unembed:
            raise ValueError("LoRA on the output layer (train_unembed) is not served with the vLLM generator: "
                             "pass train_unembed=False, or use the embedded engine")
        self.check_new(name, rank)
        assert self.policy.lora is not None
        await self.worker.run(add_lora_adapter, self.policy.model, name, self.policy.lora, rank)
        learner = self._learner(name)
        path = await learner.export_adapter()
        first = f"{name}-v0"
        await self.vllm.client.load_lora(first, str(path))
        self.vllm.launch.adapters[name] = (first, path)
        self.vllm.adapter_versions[name] = 0
        engine = self._compose(name, learner)
        self._engines[name] = engine
        return engine

    async def remove(self, name: str) -> None:
        """Stop serving and training ``name``: new requests are refused (``param="model"``), its LoRA is unloaded
        from vLLM once its running requests finish, its weights leave the module. The last adapter stays."""
        engine = self.engine(name)
        if len(self._engines) == 1:
            raise ValueError(f"adapter {name!r} is the last one: an engine keeps at least one adapter")
        del self._engines[name]
        self.vllm.adapter_versions.pop(name, None)
        await self.vllm.served.drop(name)
        await engine.learner.close()
        await self.worker.run(_delete_adapter, self.policy.model, name, self.names()[0])

    # ------------------------------------------------------------------ shared facts
    @property
    def tokenizer(self) -> Any:
        return self.vllm.tokenizer

    @property
    def max_context(self) -> int:
        return self.vllm.max_context

    def describe(self) -> dict[str, Any]:
        """vLLM (the adapters' versions and served names) and each adapter's learner."""
        return {**self.vllm.describe(), "layout": "vllm+in-process (LoRA adapters)",
                "adapter_versions": dict(self.vllm.adapter_versions),
                "lora_names": {name: lora[0] for name, lora in self.vllm.launch.adapters.items()},
                "max_loras": self.vllm.launch.max_loras,
                "learners": {name: engine.learner.describe() for name, engine in self._engines.items()}}

    async def close(self) -> None:
        """Every adapter's learner (temporary exports), then vLLM and the shared worker, once."""
        for engine in list(self._engines.values()):
            await engine.seam.close()
            await engine.learner.close()
        await self.vllm.close()
        self.worker.close()


def _delete_adapter(model: Any, name: str, fallback: str) -> None:
    """Delete adapter ``name`` from the PEFT module (making ``fallback`` active first if ``name`` was)."""
    if name in model.active_adapters:
        model.set_adapter(fallback)
    model.delete_adapter(name)


def vllm_adapters(config: ServerConfig, work_dir: Path, start: bool = True) -> VLLMAdapters:
    """vLLM with one named LoRA adapter per entry of ``learner.lora.adapters`` on one frozen base, each loaded at
    start as ``<name>-v0`` (a fresh adapter: the base's outputs)."""
    names = config.swarm_adapters()
    if not names:
        raise ValueError("vllm_adapters needs at least one adapter name (learner.lora.adapters)")
    if not config.learner.lora.enabled:
        raise ValueError(f"LoRA adapters {names} need a LoRA rank (learner.lora.rank > 0): set --lora-rank N")
    if config.learner.group.procs:
        raise ValueError("LoRA adapters need the in-process learner: set learner.group.procs to 0 (--train-procs 0)")
    for name in names:
        check_adapter_name(name)
    s = config.generator.vllm
    if config.learner.lora.rank > s.lora_max_rank:
        raise ValueError(f"LoRA rank {config.learner.lora.rank} is above vLLM's --max-lora-rank {s.lora_max_rank}: "
                         "raise generator.vllm.lora_max_rank")
    slots = max_loras(config, len(names))
    if LORAS_PER_ADAPTER * len(names) > slots:
        raise ValueError(f"{len(names)} adapters need {LORAS_PER_ADAPTER} LoRA slots each, but "
                         f"generator.vllm.max_loras is {slots}: raise it (or 0: 2 per adapter)")
    policy = load_policy_model(config.model, config.placement, config.learner, names)
    gen = config.generator
    context = policy.facts.context_length
    vllm = VLLMGenerator(policy.path, policy.facts.tokenizer, s, stop_ids=set(policy.facts.stop_ids),
                         max_context=min(gen.max_context or context, context), seed=gen.seed, lora_adapters=True,
                         work_dir=work_dir, start=False)
    vllm.launch.max_loras = slots
    vllm.adapter_versions = dict.fromkeys(names, 0)
    layout = VLLMAdapters(config, policy, vllm, work_dir)
    for name in names:  # the fresh adapters, loaded by vLLM at start (and after a restart) as <name>-v0
        path = run_blocking(layout.engine(name).learner.export_adapter())
        vllm.launch.adapters[name] = (f"{name}-v0", path)
    if start:
        vllm.start()
    return layout
