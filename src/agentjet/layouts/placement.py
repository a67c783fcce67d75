"""Device placement, checked before anything starts: the rollout GPUs and the learner's must not overlap unless
``placement.colocate`` asks for it.

The rollout GPUs are the embedded generator's ``placement.device``, or ``generator.vllm.cuda_visible_devices``,
else every GPU the server sees; the learner's are the embedded device (the in-process learner), or
``learner.group.cuda_visible_devices``, else the first ``learner.group.procs`` GPUs. All are physical ids: an
index into the server's own ``CUDA_VISIBLE_DEVICES`` is mapped through it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from agentjet.settings import EngineKind, ServerConfig

GpuSet = tuple[set[int], str]  # physical GPU ids (empty: the CPU) and how they were decided, for the error


class PlacementError(ValueError):
    """The generator and the learner were placed on the same GPUs without being asked to share them."""


def _ids(text: str | None) -> list[int] | None:
    return [int(x) for x in text.split(",") if x.strip()] if text else None


def _embedded(device: str, gpu_count: int, inherited: list[int]) -> GpuSet:
    """The GPU of the embedded ``placement.device`` (``cuda:N`` is the N-th GPU the server sees)."""
    if device == "cpu" or (device == "auto" and gpu_count == 0):
        return set(), "the CPU"
    index = int(device.split(":")[1]) if ":" in device else 0
    return {inherited[index] if index < len(inherited) else index}, f"placement.device {device!r}"


def _rollout(config: ServerConfig, gpu_count: int, inherited: list[int]) -> GpuSet:
    if config.generator.kind is not EngineKind.VLLM:
        return _embedded(config.placement.device, gpu_count, inherited)
    v = config.generator.vllm
    if v.platform == "cpu":
        return set(), "the CPU"
    own = _ids(v.cuda_visible_devices) or _ids(v.extra_env.get("CUDA_VISIBLE_DEVICES"))
    why = (f"generator.vllm.cuda_visible_devices {v.cuda_visible_devices!r}" if v.cuda_visible_devices
           else "every GPU the server sees (generator.vllm.cuda_visible_devices unset)")
    return set(own or inherited), why


def _learner(config: ServerConfig, gpu_count: int, inherited: list[int]) -> GpuSet:
    t = config.learner.group
    if not t.procs:
        gpus, why = _embedded(config.placement.device, gpu_count, inherited)
        return gpus, f"the in-process learner on {why}"
    if t.device == "cpu" or (t.device == "auto" and gpu_count == 0):
        return set(), "the CPU"
    own = _ids(t.cuda_visible_devices)
    why = (f"learner.group.cuda_visible_devices {t.cuda_visible_devices!r}" if own else
           f"the first {t.procs} GPU(s) the server sees (learner.group.cuda_visible_devices unset)")
    return set((own or inherited)[: t.procs]), why


def check_placement(config: ServerConfig, gpu_count: int | None = None,
                    environ: Mapping[str, str] | None = None) -> None:
    """The rollout GPUs and the learner's must not overlap unless ``placement.colocate`` asks for it. CPU layouts
    share the CPU and are exempt; so is the single-process layout, whose learner shares the generator's module."""
    kind = config.generator.kind
    if kind is EngineKind.NULL or (kind is EngineKind.HF and not config.learner.group.procs):
        return
    if gpu_count is None:
        gpu_count = torch.cuda.device_count()
    env = os.environ if environ is None else environ
    inherited = _ids(env.get("CUDA_VISIBLE_DEVICES")) or list(range(gpu_count))
    (rollout, why_r), (learner, why_l) = _rollout(config, gpu_count, inherited), _learner(config, gpu_count, inherited)
    both = sorted(rollout & learner)
    if both and not config.placement.colocate:
        raise PlacementError(
            f"the rollout engine ({kind.value}) uses GPU(s) {sorted(rollout)} ({why_r}) and the "
            f"learner uses GPU(s) {sorted(learner)} ({why_l}): they overlap on {both}. Give each its own "
            "(--vllm-cuda-visible-devices / --learner-devices), or share them on purpose with --colocate")
