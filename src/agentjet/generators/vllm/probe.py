"""The staleness probe: a fixed prompt that vLLM and the trainer both score after every weight sync.

Two parts, because they catch different faults:

* the prompt's own logprobs (``prompt_logprobs``; vLLM computes them without reading the prefix cache):
  wrong or half-loaded weights, e.g. a new body with the old output head;
* a few tokens sampled after the prompt: their logprobs go through the prefix cache, which the previous
  sync's probe filled, so KV left over from the old weights shows here. The prompt is longer than one
  KV block (128 tokens on CPU), or nothing would be cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PROBE_TEXT = (
    "The lighthouse keeper climbed the spiral stairs at dusk, counting each of the one hundred and twelve "
    "steps as he had done every evening for thirty years. At the top he trimmed the wick, polished the great "
    "lens, and watched the first ships of the night appear as small lights on the dark water. "
)
PROBE_TOKENS = 200  # > 128 (one CPU KV block), so the sampled part reads the prefix cache


def probe_prompt_ids(tokenizer: Any, max_context: int, n_tokens: int = PROBE_TOKENS) -> list[int]:
    """A fixed chat prompt of ``n_tokens`` tokens (fewer when the context is small)."""
    n = max(8, min(n_tokens, max_context // 2))
    text = PROBE_TEXT
    while True:
        ids = list(tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                 add_generation_prompt=False, return_dict=False))
        if len(ids) >= n:
            return ids[:n]
        text += PROBE_TEXT


@dataclass(frozen=True)
class ProbeResult:
    prompt_diff: float  # mean |lp_vllm - lp_trainer| over the prompt's tokens 1..n-1
    gen_diff: float  # the same over the sampled tokens
    prompt_tokens: int
    gen_tokens: int

    @property
    def diff(self) -> float:
        """The figure the threshold applies to: the worse part (a short sampled part is not diluted)."""
        return max(self.prompt_diff, self.gen_diff)

    def as_metrics(self) -> dict[str, float]:
        return {"probe_logprob_diff": self.diff, "probe_prompt_diff": self.prompt_diff,
                "probe_gen_diff": self.gen_diff}


def _mean_abs(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"cannot compare {len(a)} with {len(b)} logprobs")
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / max(len(a), 1)


def compare(vllm_prompt: list[float], vllm_gen: list[float], trainer: list[float]) -> ProbeResult:
    """``trainer``: the trainer's logprobs of prompt tokens 1..n-1 followed by the sampled tokens."""
    n = len(vllm_prompt)
    if len(trainer) != n + len(vllm_gen):
        raise ValueError(f"the trainer scored {len(trainer)} tokens, expected {n + len(vllm_gen)}")
    return ProbeResult(prompt_diff=_mean_abs(vllm_prompt, trainer[:n]), gen_diff=_mean_abs(vllm_gen, trainer[n:]),
                       prompt_tokens=n, gen_tokens=len(vllm_gen))
