"""The learner's own micro-batch size (``learner.micro_batch_tokens`` unset): fixed on CPU, from free memory on
CUDA (the free bytes are given here, so no GPU is needed)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from agentjet.engines.memory import (
    CPU_MICRO_BATCH_TOKENS,
    MAX_TOKENS,
    MIN_TOKENS,
    activation_bytes_per_token,
    auto_micro_batch_tokens,
)

SMOLLM2_135M = SimpleNamespace(hidden_size=576, intermediate_size=1536, num_hidden_layers=30)
CUDA = torch.device("cuda", 0)
GIB = 2**30


def test_cpu_keeps_the_fixed_default() -> None:
    assert auto_micro_batch_tokens(SMOLLM2_135M, torch.device("cpu"), 4, False) == CPU_MICRO_BATCH_TOKENS


def test_cuda_sizes_from_free_memory_rounded_and_clamped() -> None:
    per_token = activation_bytes_per_token(SMOLLM2_135M, 2, False)
    assert per_token == 30 * (8 * 576 + 4 * 1536) * 2 * 2  # layers x elements x bf16 bytes x safety
    got = auto_micro_batch_tokens(SMOLLM2_135M, CUDA, 2, False, free_bytes=40 * GIB)
    assert got == int(40 * GIB * 0.5 / per_token) // 256 * 256
    assert 16_384 <= got < 20_000  # a 16 x 1024 batch is one micro-batch on 40 GiB free
    assert auto_micro_batch_tokens(SMOLLM2_135M, CUDA, 2, False, free_bytes=80 * GIB) > got
    assert auto_micro_batch_tokens(SMOLLM2_135M, CUDA, 4, False, free_bytes=40 * GIB) < got  # fp32 activations
    assert auto_micro_batch_tokens(SMOLLM2_135M, CUDA, 2, True, free_bytes=40 * GIB) > got  # checkpointing
    assert auto_micro_batch_tokens(SMOLLM2_135M, CUDA, 2, False, free_bytes=10**6) == MIN_TOKENS
    assert auto_micro_batch_tokens(SMOLLM2_135M, CUDA, 2, False, free_bytes=10**15) == MAX_TOKENS


def test_the_in_process_learner_uses_the_setting_or_sizes_it_itself(tiny_model_path: Path) -> None:
    from agentjet.layouts import embedded_engine
    from agentjet.runtime.blocking import run_blocking
    from agentjet.settings import LearnerSettings

    for setting, expected in ((None, CPU_MICRO_BATCH_TOKENS), (64, 64)):
        engine = embedded_engine(tiny_model_path, None, LearnerSettings(micro_batch_tokens=setting))
        try:
            assert engine.learner.micro_batch_tokens == expected
            assert engine.learner.describe()["micro_batch_tokens"] == expected
        finally:
            run_blocking(engine.close())
