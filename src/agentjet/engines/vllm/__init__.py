"""vLLM as the rollout engine: a managed vLLM subprocess generates, the embedded engine's training half trains,
and the weights go to vLLM after every train step (see docs/vllm.md)."""

from agentjet.engines.vllm.engine import VLLMEngine
from agentjet.engines.vllm.settings import VLLM_VERSION, VLLMSettings

__all__ = ["VLLM_VERSION", "VLLMEngine", "VLLMSettings"]
