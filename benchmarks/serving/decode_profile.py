"""Where a decode step of the embedded engine goes on CPU: the slot runner (continuous batching) against HF's own
decode loop with a ``DynamicCache``, on the same 8 rows, then a torch-profiler table for each.

    flock /tmp/aj-cpu.lock .venv/bin/python benchmarks/serving/decode_profile.py     # ~1 min; prints only

Findings are in docs/benchmarks.md ("Continuous batching ... on this CPU").
"""

from __future__ import annotations

import time

import agentjet  # noqa: F401

# isort: split
import torch
from transformers import DynamicCache

from agentjet.layouts import embedded_engine
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import GeneratorSettings

ROWS = 8


def main() -> None:
    engine = embedded_engine("smollm2-135m-instruct", GeneratorSettings(max_batch_size=ROWS, batching="continuous"))
    ids = list(engine.tokenizer.apply_chat_template([{"role": "user", "content": "Write a long poem about the sea."}],
                                                    add_generation_prompt=True, tokenize=True, return_dict=False))
    runner, model = engine.generator.core.runner, engine.generator.causal_lm
    assert runner is not None
    slots = torch.arange(ROWS)

    def slot_steps(steps: int) -> float:
        runner.restart()
        runner.set_next_tokens(slots, runner.prefill(list(range(ROWS)), [ids] * ROWS).argmax(-1))
        t0 = time.perf_counter()
        for _ in range(steps):
            runner.set_next_tokens(slots, runner.decode(ROWS)[:ROWS].argmax(-1))
        runner.release(list(range(ROWS)))
        return (time.perf_counter() - t0) / steps

    @torch.inference_mode()
    def hf_steps(steps: int) -> float:
        x = torch.tensor([ids] * ROWS)
        cache = DynamicCache()
        nxt = model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(
            -1, keepdim=True)
        attn = torch.ones(ROWS, x.shape[1] + 1 + steps, dtype=torch.long)
        t0 = time.perf_counter()
        for i in range(steps):
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True,
                        attention_mask=attn[:, : x.shape[1] + i + 1])
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        return (time.perf_counter() - t0) / steps

    for rep in range(2):
        print(f"rep {rep}: slot runner {slot_steps(64) * 1000:.1f} ms/step; "
              f"HF DynamicCache {hf_steps(64) * 1000:.1f} ms/step", flush=True)
    for name, fn in (("slot runner", slot_steps), ("HF DynamicCache", hf_steps)):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn(16)
        print(name)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    run_blocking(engine.close())


if __name__ == "__main__":
    main()
