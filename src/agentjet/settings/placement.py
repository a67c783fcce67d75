"""Where the parts run (``placement``): the server process's own model copy and whether the generator and the
learner may share GPUs. prime-rl sets its split of the GPUs (inference, trainer) in its rl config."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentjet.settings.section import Section


class PlacementSettings(Section):
    """Where the parts run: the server process's own model copy (the embedded generator's, and the in-process
    learner's), and whether the generator and the learner may share GPUs (restart to change). The GPU lists of
    vLLM and of the learner's processes are their own settings: ``generator.vllm.cuda_visible_devices`` and
    ``learner.group.cuda_visible_devices``."""

    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="the server process's model: "
                        "auto (CUDA when present), cpu, cuda or cuda:N")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="the server process's model: weight dtype (auto: bfloat16 on CUDA, float32 on CPU)")
    colocate: bool = Field(False, description="let the generator and the learner share GPUs on purpose (e.g. vLLM "
                           "with a low gpu_memory_utilization beside a one-rank learner group); otherwise an "
                           "overlap is an error at start-up")
