"""Tinker ``sample`` throughput against the swarm's chat path, at N concurrent requests, in one server process.

Both sides generate on one engine (the served base with LoRA adapters: the swarm's ``policy`` for the chat path, a
fresh Tinker training client's snapshot for ``sample``, both of rank 8 and at zero) from the same prompt tokens
(the chat template of one user message), with the same ``max_tokens``, temperature and seeds (request i of a round
uses seed ``seed + i``), end-of-sequence ids off so every request generates ``max_tokens`` tokens. Rounds
alternate the sides (chat, tinker, tinker, chat, ...); each round sends N requests at once and waits for all;
tokens/s is generated tokens over the round's wall time; the reported figures are medians over the rounds.
Target: tinker >= 0.9x the chat path's tokens/s.

    python benchmarks/serving/tinker_sample.py [--concurrent 8] [--max-tokens 64] [--rounds 6]

Writes benchmarks/results/tinker_sample.json (with the machine and commit).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import tinker
import torch
from tinker import types

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workloads import RESULTS, machine  # noqa: E402

from agentjet.layouts import build_adapters  # noqa: E402
from agentjet.runtime.launch import free_port  # noqa: E402
from agentjet.server import SwarmServer  # noqa: E402
from agentjet.server.http.app import BackgroundServer  # noqa: E402
from agentjet.settings import LearnerSettings, ServerConfig  # noqa: E402

KEY = "tml-bench"
MESSAGES = [{"role": "user", "content": "Write a short story about a robot who learns to paint. Be creative."}]


class ChatSide:
    """N concurrent ``/v1/chat/completions`` calls, each on an episode of its own."""

    def __init__(self, url: str, n: int, max_tokens: int, temperature: float) -> None:
        self.url, self.max_tokens, self.temperature = url, max_tokens, temperature
        self.http = httpx.Client(timeout=600)
        eps = [self.http.post(f"{url}/swarm/v1/episodes", json={"client_id": "bench", "task_id": f"t{i}"}).json()
               for i in range(n)]
        self.keys = [e["api_key"] for e in eps]
        self.episodes = [e["episode_id"] for e in eps]

    def one(self, i: int, seed: int) -> tuple[int, int]:
        body = {"model": "agent", "messages": MESSAGES, "max_tokens": self.max_tokens,
                "temperature": self.temperature, "seed": seed}
        r = self.http.post(f"{self.url}/v1/chat/completions", json=body,
                           headers={"Authorization": f"Bearer {self.keys[i]}"})
        r.raise_for_status()
        usage = r.json()["usage"]
        return usage["prompt_tokens"], usage["completion_tokens"]


class TinkerSide:
    """N concurrent ``SamplingClient.sample`` calls through the official SDK."""

    def __init__(self, url: str, base_model: str, prompt: list[int], max_tokens: int, temperature: float) -> None:
        service = tinker.ServiceClient(base_url=url, api_key=KEY)
        trainer = service.create_lora_training_client(base_model=base_model, rank=8).result()
        self.client = trainer.save_weights_and_get_sampling_client().result()
        self.prompt = types.ModelInput.from_ints(prompt)
        self.n_prompt, self.max_tokens, self.temperature = len(prompt), max_tokens, temperature

    def many(self, seeds: list[int]) -> list[tuple[int, int]]:
        futs = [self.client.sample(self.prompt, 1, types.SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, seed=s)) for s in seeds]
        return [(self.n_prompt, len(f.result().sequences[0].tokens)) for f in futs]


def run_round(side: str, chat: ChatSide, tk: TinkerSide, seeds: list[int], pool: ThreadPoolExecutor
              ) -> dict[str, Any]:
    t0 = time.perf_counter()
    got = list(pool.map(chat.one, range(len(seeds)), seeds)) if side == "chat" else tk.many(seeds)
    wall = time.perf_counter() - t0
    tokens = sum(c for _, c in got)
    return {"side": side, "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall,
            "prompt_tokens": sorted({p for p, _ in got})}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--concurrent", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=6, help="rounds per side (after one warm-up round each)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", type=Path, default=RESULTS / "tinker_sample.json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ServerConfig(model=args.model, tinker_key=KEY, port=free_port(), data_dir=Path(tmp),
                           learner=LearnerSettings(lora={"rank": 8}))
        engine = build_adapters(cfg)
        engine.generator.rules.stop_ids = frozenset()  # fixed-length generations: every request makes max_tokens
        with BackgroundServer(SwarmServer(cfg, engine)) as srv:
            prompt = srv.server.formatter.prompt_ids(MESSAGES, None)
            chat = ChatSide(srv.url, args.concurrent, args.max_tokens, args.temperature)
            tk = TinkerSide(srv.url, cfg.name, list(prompt), args.max_tokens, args.temperature)
            seeds = [args.seed + i for i in range(args.concurrent)]
            rows: list[dict[str, Any]] = []
            with ThreadPoolExecutor(args.concurrent) as pool:
                for side in ("chat", "tinker"):  # warm-up, not counted
                    run_round(side, chat, tk, seeds, pool)
                for r in range(args.rounds):
                    for side in (("chat", "tinker") if r % 2 == 0 else ("tinker", "chat")):
                        row = run_round(side, chat, tk, seeds, pool)
                        rows.append({"round": r, **row})
                        print(f"round {r} {side}: {row['tokens']} tokens in {row['wall_s']:.2f} s = "
                              f"{row['tokens_per_s']:.1f} tokens/s", flush=True)
                    for ep in chat.episodes:  # keep the episodes' records small
                        srv.server.registry.get(ep).calls.clear()
    med = {s: statistics.median(r["tokens_per_s"] for r in rows if r["side"] == s) for s in ("chat", "tinker")}
    ratio = med["tinker"] / med["chat"]
    prompts = {s: sorted({p for r in rows if r["side"] == s for p in r["prompt_tokens"]}) for s in ("chat", "tinker")}
    out = {"benchmark": "tinker_sample", "machine": machine(torch.device("cpu")), "model": args.model,
           "concurrent": args.concurrent, "max_tokens": args.max_tokens, "temperature": args.temperature,
           "rounds_per_side": args.rounds, "prompt_tokens": prompts, "median_tokens_per_s": med, "ratio": ratio,
           "target": 0.9, "rounds": rows}
    print(f"{args.model}, {args.concurrent} concurrent x {args.max_tokens} tokens, prompt {prompts['tinker']} "
          f"tokens: chat path {med['chat']:.1f} tokens/s, tinker sample {med['tinker']:.1f} tokens/s, "
          f"ratio {ratio:.2f}x (target >= 0.9)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
