"""The layouts a server runs: one generator composed with one learner and the seam that joins them
(``composed.py: ComposedEngine``, an ``engines.base.Engine``), one module per layout.

| generator | learner            | seam (weight transport)                       | built by                             |
|-----------|--------------------|-----------------------------------------------|--------------------------------------|
| embedded  | in process         | in place (one shared module)                  | ``embedded.py``: ``embedded_engine`` |
| embedded, its engine process | in process | safetensors (``/dev/shm``) copied in place | ``engine_process.py``: ``engine_process_engine`` |
| embedded  | trainer group      | safetensors (``/dev/shm``) copied in place    | ``group.py``: ``group_engine``       |
| vLLM      | in process         | safetensors + vLLM reload (+ probe)           | ``vllm.py``: ``vllm_engine``         |
| vLLM      | trainer group      | safetensors + vLLM reload (+ probe)           | ``vllm.py``: ``vllm_engine``         |
| null      | null               | none (the version only)                       | ``null.py``: ``null_engine``         |
| N replicas| in process or group| one export pushed to every replica (+ probe)  | ``fleet.py``: ``fleet_engine``       |

(NCCL through vLLM's weight-transfer API is the fast path for vLLM with the in-process learner on GPUs:
``generators/vllm/native_sync.py``.) One base with several named LoRA adapters, one engine per adapter (an
``engines.base.AdapterSet``): on one shared embedded generator, ``adapters.py`` (``adapter_engines``); on one
shared vLLM, ``vllm_adapters.py`` (``vllm_adapters``); without a model, ``null.py`` (``NullAdapters``).

``build.py`` chooses from the settings: ``build_engine`` (one policy: an ``Engine``; the embedded generator on a
thread of this process or in an engine process of its own, as ``generator.engine_process`` says) and
``build_adapters`` (an ``AdapterSet``: always in process). Device placement is checked before anything starts (``placement.py``: ``check_placement``).
"""

from agentjet.layouts.adapters import AdapterEngines, adapter_engines
from agentjet.layouts.build import build_adapters, build_engine, build_from_settings
from agentjet.layouts.composed import ComposedEngine
from agentjet.layouts.embedded import embedded_engine
from agentjet.layouts.engine_process import engine_process_engine
from agentjet.layouts.fleet import fleet_engine
from agentjet.layouts.group import group_engine
from agentjet.layouts.null import NullAdapters, null_engine
from agentjet.layouts.placement import PlacementError, check_placement
from agentjet.layouts.vllm import vllm_engine
from agentjet.layouts.vllm_adapters import VLLMAdapters, vllm_adapters

__all__ = ["AdapterEngines", "ComposedEngine", "NullAdapters", "PlacementError", "VLLMAdapters", "adapter_engines",
           "build_adapters", "build_engine", "build_from_settings", "check_placement", "embedded_engine",
           "engine_process_engine", "fleet_engine", "group_engine",
           "null_engine", "vllm_adapters", "vllm_engine"]
