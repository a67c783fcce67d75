"""Tinker API overhead: forward_backward(importance_sampling) + optim_step through the official SDK against the
in-process learner's train_step on the same tokens, each on its own LoRA adapter of one served base, one process.

    python benchmarks/serving/tinker_overhead.py [--model smollm2-135m-instruct] [--seqs 16] [--prompt 64] [--reply 32]
"""

from __future__ import annotations

import argparse
import random
import time

import tinker
from tinker import types

from agentjet.engines.base import TrainSample
from agentjet.layouts import build_adapters
from agentjet.runtime.launch import free_port
from agentjet.server import SwarmServer
from agentjet.server.http.app import BackgroundServer
from agentjet.settings import LearnerSettings, ServerConfig

KEY = "tml-bench"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--seqs", type=int, default=16)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--reply", type=int, default=32)
    p.add_argument("--steps", type=int, default=3)
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


if __name__ == "__main__":
    main()
