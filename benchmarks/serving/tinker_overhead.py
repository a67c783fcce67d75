"""Tinker API overhead: forward_backward(importance_sampling) + optim_step through the official SDK against the
in-process learner's train_step on the same tokens, each on its own LoRA adapter of one served base, one process.

    python benchmarks/serving/tinker_overhead.py [--model smollm2-135m-instruct] [--seqs 16] [--prompt 64] [--reply 32]

JSON with commit and machine: benchmarks/results/tinker_overhead.json (``--output``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import tinker
import torch
from tinker import types

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # workloads.py
from workloads import RESULTS, machine  # noqa: E402

from agentjet.engines.base import TrainSample  # noqa: E402
from agentjet.layouts import build_adapters  # noqa: E402
from agentjet.runtime.launch import free_port  # noqa: E402
from agentjet.server import SwarmServer  # noqa: E402
from agentjet.server.http.app import BackgroundServer  # noqa: E402
from agentjet.settings import LearnerSettings, ServerConfig

KEY = "tml-bench"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--seqs", type=int, default=16)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--reply", type=int, default=32)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--output", type=Path, default=RESULTS / "tinker_overhead.json")
    args = p.parse_args()
    cfg = ServerConfig(model=args.model, tinker_key=KEY, port=free_port(), learner=LearnerSettings(lora={"rank": 8}))
    srv = BackgroundServer(SwarmServer(cfg, build_adapters(cfg))).start()
    rng = random.Random(0)
    vocab = 1000
    seqs = [[rng.randrange(10, vocab) for _ in range(args.prompt + args.reply)] for _ in range(args.seqs)]
    n_p = args.prompt

    tc = tinker.ServiceClient(base_url=srv.url, api_key=KEY).create_lora_training_client(
        base_model=cfg.name, rank=8).result()
    data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]), loss_fn_inputs={
        "target_tokens": s[1:], "logprobs": [0.0] * (n_p - 1) + [-3.0] * args.reply,
        "advantages": [0.0] * (n_p - 1) + [0.5] * args.reply}) for s in seqs]
    samples = [TrainSample(input_ids=s, loss_mask=[0] * n_p + [1] * args.reply,
                           behaviour_logprobs=[0.0] * n_p + [-3.0] * args.reply,
                           advantages=[0.0] * n_p + [0.5] * args.reply) for s in seqs]
    adapters = srv.server.adapters
    assert adapters is not None
    srv.call(adapters.add("bench", 8, unembed=True))  # the same adapter shape as the SDK client's (train_unembed)
    learner = adapters.engine("bench").learner

    def sdk_step() -> None:
        tc.forward_backward(data, "importance_sampling").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-5)).result()

    def inproc_step() -> None:
        srv.call(learner.train_step(samples))

    times = {}
    for name, fn in (("inproc", inproc_step), ("sdk", sdk_step), ("inproc2", inproc_step), ("sdk2", sdk_step)):
        fn()  # warm
        t = time.perf_counter()
        for _ in range(args.steps):
            fn()
        times[name] = (time.perf_counter() - t) / args.steps
    inproc, sdk = min(times["inproc"], times["inproc2"]), min(times["sdk"], times["sdk2"])
    print(f"{args.model}: {args.seqs} seqs x {args.prompt}+{args.reply} tokens; in-process step {inproc:.3f} s, "
          f"SDK forward_backward+optim_step {sdk:.3f} s, ratio {sdk / inproc:.2f}x  ({times})")
    srv.stop()
    result = {"benchmark": "tinker_overhead", "command": " ".join(["benchmarks/serving/tinker_overhead.py", *sys.argv[1:]]),
              "machine": machine(torch.device("cpu")), "model": args.model, "seqs": args.seqs, "prompt": args.prompt,
              "reply": args.reply, "steps": args.steps, "inprocess_step_s": inproc, "sdk_step_s": sdk,
              "sdk_over_inprocess": sdk / inproc, "rounds_s": times}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
