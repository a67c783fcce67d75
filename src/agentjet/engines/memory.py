"""How many tokens a learner's forward/backward micro-batch holds when the setting leaves it to the learner.

On CPU the answer is a fixed 4,096 padded tokens (memory there is the machine's, shared with everything else). On
CUDA it is what a share of the device's free memory holds at the learner's start, at an estimated activation
cost per token. The estimate counts what a decoder layer keeps for backward, in elements per token:

* attention: the normed input, Q, K and V, the attention output and the output projection's input (about 8
  hidden-sized vectors with the residual and the norms);
* the gated MLP: the normed input (1 hidden), gate, up, the activation and their product (4 intermediate).

So ``layers x (8 hidden + 4 intermediate)`` elements, at the activations' width (2 bytes under bf16), times a
safety factor of 2 for the allocator's fragmentation and the transient buffers of backward. Under gradient
checkpointing a layer keeps only its input, plus one layer's full set during recomputation. The vocabulary
projection is chunked (``logprob_chunk_tokens``), so logits never exist for the whole micro-batch.
"""

from __future__ import annotations

from typing import Any

import torch

CPU_MICRO_BATCH_TOKENS = 4096
FREE_MEMORY_SHARE = 0.5  # of the device's free memory at the learner's start; the rest is for the optimizer's
# first step, the generator's KV cache growing beside a colocated learner, and other processes
SAFETY = 2.0
MIN_TOKENS, MAX_TOKENS = 1024, 262_144
ROUND_TO = 256


def activation_bytes_per_token(config: Any, act_bytes: int, checkpointing: bool) -> float:
    """The estimated activation memory one trained token costs, over the whole decoder (see the module doc)."""
    hidden, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    per_layer = 8 * hidden + 4 * inter
    elements = (layers * hidden + per_layer) if checkpointing else layers * per_layer
    return elements * act_bytes * SAFETY


def auto_micro_batch_tokens(config: Any, device: torch.device, act_bytes: int, checkpointing: bool,
                            free_bytes: int | None = None) -> int:
    """The micro-batch in padded tokens: 4,096 on CPU; on CUDA, what ``FREE_MEMORY_SHARE`` of the free device memory
    (``free_bytes``, else ``torch.cuda.mem_get_info``) holds, rounded down to 256 and clamped to 1,024-262,144."""
    if device.type != "cuda":
        return CPU_MICRO_BATCH_TOKENS
    if free_bytes is None:
        free_bytes, _total = torch.cuda.mem_get_info(device)
    tokens = int(free_bytes * FREE_MEMORY_SHARE / activation_bytes_per_token(config, act_bytes, checkpointing))
    return max(MIN_TOKENS, min(MAX_TOKENS, tokens // ROUND_TO * ROUND_TO))
