"""vLLM as the rollout engine: a managed vLLM subprocess generates, the embedded engine's training half trains,
and the weights go to vLLM after every train step (see docs/vllm.md). Its settings are
``agentjet.settings.VLLMSettings`` (``engine.vllm`` in the server's settings)."""

from agentjet.engines.vllm.engine import VLLMEngine
from agentjet.settings.models import VLLM_VERSION, VLLMSettings

__all__ = ["VLLM_VERSION", "VLLMEngine", "VLLMSettings"]
