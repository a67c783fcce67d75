"""One frozen base, several named LoRA adapters, in the embedded engine: the layout that trains a team's roles
(or any set of policies on one base) as adapters of one model instead of one model each.

One ``ContinuousHFGenerator`` holds the base and every adapter (one PEFT module) and runs rows of different adapters in
the same batch. Per adapter, a ``ComposedEngine`` joins a view of that generator routed to the adapter
(``generators/hf/adapters.AdapterGenerator``) with an ``InProcessLearner`` that trains that adapter alone, on the
generator's worker thread, through the in-place seam: exactly the single-process layout, once per adapter, on
one shared module. Each adapter has its own optimizer, policy version, exports and checkpoints; a step of one
adapter changes no other adapter's outputs. Adapters are added and removed while requests run (between decode
steps).

What it does not do: static batching, CUDA graphs or ``torch.compile`` with adapters (the mixed batch runs
eagerly), a trainer group as the other half (refused with the setting to change). vLLM as the generator:
``layouts/vllm_adapters.py``, which shares ``NamedEngines`` with this layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from agentjet.engines.model import check_adapter_name, load_policy_model
from agentjet.generators.hf.adapters import AdapterGenerator
from agentjet.generators.hf.continuous import ContinuousHFGenerator
from agentjet.layouts.composed import ComposedEngine, NamedEngines
from agentjet.learners.inprocess import InProcessLearner
from agentjet.settings import (
    EngineKind,
    GeneratorSettings,
    LearnerSettings,
    LossSettings,
    PlacementSettings,
)
from agentjet.weights.sync import InPlace, WeightSync

AdapterEngine = ComposedEngine[InProcessLearner, AdapterGenerator]


def _version_setter(view: AdapterGenerator) -> Any:
    """The learner's ``on_version``: the adapter's new version is served from the next decode step on."""
    def set_version(version: int) -> None:
        view.policy_version = version

    return set_version


class AdapterEngines(NamedEngines[AdapterEngine]):
    """One frozen base, several LoRA adapters: one ContinuousHFGenerator (mixed-adapter batches) and, per adapter, a
    ComposedEngine whose generator view routes rows to that adapter and whose learner trains only it."""

    def __init__(self, generator: ContinuousHFGenerator, learner: LearnerSettings, loss: LossSettings) -> None:
        if not generator.mixed_adapters:
            raise ValueError("AdapterEngines needs a generator built with named LoRA adapters (adapter_engines)")
        self.generator = generator
        self.learner_settings = learner
        self.loss = loss
        self._engines: dict[str, AdapterEngine] = {name: self._compose(name) for name in generator.adapter_versions}

    def _compose(self, name: str) -> AdapterEngine:
        view = AdapterGenerator(self.generator, name)
        trainer = InProcessLearner(self.generator.policy, self.learner_settings, self.loss,
                                   worker=self.generator.worker, adapter=name, on_version=_version_setter(view))
        # InPlace serves any learner and generator that share a module (it only moves the version): the cast
        # states that for this pair (WeightSync's type parameters are invariant)
        return ComposedEngine(view, trainer, cast(WeightSync[InProcessLearner, AdapterGenerator], InPlace()))

    # ------------------------------------------------------------------ the adapters
    async def add(self, name: str, rank: int | None = None, unembed: bool = False) -> AdapterEngine:
        """A fresh adapter (the learner's LoRA settings; its own ``rank`` when given; with ``unembed``, on the
        output layer too), added between decode steps while other adapters generate and train; served and trained
        from version 0."""
        if name in self._engines:
            raise ValueError(f"adapter {name!r} exists already: the adapters are {self.names()}")
        await self.generator.add_adapter(name, rank, unembed)
        engine = await self.generator.worker.run(self._compose, name)  # reads the module: between decode steps
        self._engines[name] = engine
        return engine

    async def remove(self, name: str) -> None:
        """Stop serving and training ``name`` and free its weights and optimizer. Its requests still queued or
        generating fail with a ``GenerationError`` (``param="model"``), new ones are refused the same way; a train
        step of it already under way finishes first, later ones fail. The last adapter stays."""
        engine = self.engine(name)
        await self.generator.remove_adapter(name)
        del self._engines[name]
        await engine.close()  # the learner's temporary exports; the shared generator and worker stay

    # ------------------------------------------------------------------ shared facts
    @property
    def tokenizer(self) -> Any:
        return self.generator.tokenizer

    @property
    def max_context(self) -> int:
        return self.generator.max_context

    def describe(self) -> dict[str, Any]:
        """The shared generator (device, dtype, the adapters' versions, how mixed batches run) and each
        adapter's learner."""
        return {**self.generator.describe(), "layout": "hf+in-process (LoRA adapters)",
                "learners": {name: engine.learner.describe() for name, engine in self._engines.items()}}

    async def close(self) -> None:
        """Close every adapter's engine (their learners' temporary exports), then the shared generator once."""
        for engine in list(self._engines.values()):
            await engine.close()
        await self.generator.close()


def adapter_engines(model: str | Path, adapters: list[str], generator: GeneratorSettings | None = None,
                    learner: LearnerSettings | None = None, loss: LossSettings | None = None,
                    placement: PlacementSettings | None = None) -> AdapterEngines:
    """The embedded engine with one named LoRA adapter per entry of ``adapters`` on one frozen base. Every adapter
    takes the learner's LoRA settings (``learner.lora``: rank, alpha, targets, dropout), which must name a rank."""
    learner = learner or LearnerSettings()
    generator = generator or GeneratorSettings()
    if not adapters:
        raise ValueError("adapter_engines needs at least one adapter name")
    if not learner.lora.enabled:
        raise ValueError(f"LoRA adapters {adapters} need a LoRA rank (learner.lora.rank > 0): set --lora-rank N")
    if learner.group.procs:
        raise ValueError("LoRA adapters need the in-process learner: set learner.group.procs to 0 (--train-procs 0); "
                         "LoRA with a trainer group is not supported")
    if generator.kind is not EngineKind.HF:
        raise ValueError(f"LoRA adapters run on the embedded generator here: set generator.kind to 'hf' (got "
                         f"{generator.kind.value!r})")
    if generator.batching == "static":  # checked before loading (the model is checked when the generator is built)
        raise ValueError(f"named LoRA adapters {adapters} need continuous batching, but generator.batching is "
                         "'static': set generator.batching to 'continuous' (--batching continuous)")
    for name in adapters:
        check_adapter_name(name)
    policy = load_policy_model(model, placement, learner, adapters)
    return AdapterEngines(ContinuousHFGenerator(policy, generator), learner, loss or LossSettings())
