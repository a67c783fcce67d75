"""vLLM as the generator: a managed vLLM subprocess generates; a learner (in process or a trainer group) trains,
and the weights go to vLLM after every train step through a seam (``sync.py``: safetensors and a reload;
``native_sync.py``: NCCL). See docs/vllm.md. Its settings are ``agentjet.settings.VLLMSettings``
(``generator.vllm`` in the server's settings)."""

from agentjet.generators.vllm.engine import VLLMGenerator
from agentjet.generators.vllm.launch import VLLM_VERSION
from agentjet.generators.vllm.sync import VLLMReload
from agentjet.settings import VLLMSettings

__all__ = ["VLLM_VERSION", "VLLMGenerator", "VLLMReload", "VLLMSettings"]
