"""Pilot: pick, by measurement, a demo task on which SmolLM2-135M-Instruct improves under RL on CPU.

Two phases:

  base   measure base success rates of several candidate task formulations (several reward rules
         scored on the same generations), at a couple of temperatures and greedy.
  train  engine-level GRPO on one candidate: each step = B groups x G samples, GRPO advantages per
         group (all-equal groups skipped), one train_step per batch; a fixed held-out eval set is
         scored before training and every few steps, under a wall-clock budget.

Usage (from the repo root):

  nice -n 5 .venv/bin/python benchmarks/demo_task_pilot.py base
  nice -n 5 .venv/bin/python benchmarks/demo_task_pilot.py train --task add --reward shaped --lr 3e-5
  .venv/bin/python benchmarks/demo_task_pilot.py table          # print the table from the JSON

Results are merged into benchmarks/results/demo_task_pilot.json (one key per run).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "demo_task_pilot.json"

NUM_RE = re.compile(r"-?\d+")
WORDS = ["apple", "river", "table", "green", "house", "music", "tiger", "cloud", "bread", "stone",
         "light", "water", "chair", "plant", "smile", "horse", "paper", "dream", "ocean", "train",
         "lemon", "sugar", "glass", "money", "night", "queen", "robot", "snake", "earth", "piano"]


def _in_eval(key: str, eval_mod: int = 4) -> bool:
    """Deterministic split: an item is held out for eval iff hash(key) % eval_mod == 0."""
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % eval_mod == 0


def _norm(text: str) -> str:
    return text.strip().strip(".!\"'`*").strip()


# --------------------------------------------------------------------------- candidates
@dataclass
class Candidate:
    name: str
    items: Callable[[], list[tuple[str, dict]]]  # (key, fields) for every possible item
    user: Callable[[dict], str]
    answer: Callable[[dict], str]
    rewards: dict[str, Callable[[dict, str], float]]
    system: str | None = None
    max_tokens: int = 16
    meta: dict = field(default_factory=dict)

    def split(self, split: str) -> list[tuple[str, dict]]:
        want_eval = split == "eval"
        return [it for it in self.items() if _in_eval(it[0]) == want_eval]

    def tasks(self, split: str, n: int, seed: int) -> list[dict]:
        pool = self.split(split)
        rng = random.Random(f"{self.name}:{split}:{seed}")
        rng.shuffle(pool)
        out = []
        for i in range(n):
            key, f = pool[i % len(pool)]
            msgs = ([{"role": "system", "content": self.system}] if self.system else [])
            msgs.append({"role": "user", "content": self.user(f)})
            out.append({"task_id": f"{self.name}-{split}-{key}", "messages": msgs, "answer": self.answer(f), **f})
        return out


def _last_num(text: str) -> str | None:
    nums = NUM_RE.findall(text)
    return nums[-1] if nums else None


def r_last_num(t: dict, text: str) -> float:
    return float(_last_num(text) == t["answer"])


def r_exact(t: dict, text: str) -> float:
    return float(_norm(text) == t["answer"])


def r_shaped_num(t: dict, text: str) -> float:
    """1 for exactly the number, 0.5 for the right number last in a longer reply, else 0."""
    if _norm(text) == t["answer"]:
        return 1.0
    return 0.5 if _last_num(text) == t["answer"] else 0.0


def r_contains_only(t: dict, text: str) -> float:
    """The right number appears and the other operand does not (guards against echoing both)."""
    nums = NUM_RE.findall(text)
    return float(t["answer"] in nums and t["other"] not in nums)


def r_shaped_larger(t: dict, text: str) -> float:
    if _norm(text) == t["answer"]:
        return 1.0
    return 0.5 * r_contains_only(t, text)


def _word_hit(text: str, word: str) -> bool:
    return re.search(rf"\b{word}\b", text.lower()) is not None


def r_parity(t: dict, text: str) -> float:
    other = "odd" if t["answer"] == "even" else "even"
    return float(_word_hit(text, t["answer"]) and not _word_hit(text, other))


def r_parity_shaped(t: dict, text: str) -> float:
    if _norm(text).lower() == t["answer"]:
        return 1.0
    return 0.5 * r_parity(t, text)


def r_upper(t: dict, text: str) -> float:
    return float(t["answer"] in text)


def r_upper_shaped(t: dict, text: str) -> float:
    if _norm(text) == t["answer"]:
        return 1.0
    return 0.5 * r_upper(t, text)


CANDIDATES: dict[str, Candidate] = {
    "add": Candidate(
        name="add",
        items=lambda: [(f"{a}+{b}", {"a": a, "b": b}) for a in range(1, 21) for b in range(1, 21)],
        user=lambda f: f"What is {f['a']} + {f['b']}? Reply with only the number.",
        answer=lambda f: str(f["a"] + f["b"]),
        rewards={"last_num": r_last_num, "exact": r_exact, "shaped": r_shaped_num},
        max_tokens=16,
    ),
    "add1": Candidate(
        name="add1",
        items=lambda: [(f"{a}+{b}", {"a": a, "b": b}) for a in range(10) for b in range(10)],
        user=lambda f: f"What is {f['a']} + {f['b']}? Reply with only the number.",
        answer=lambda f: str(f["a"] + f["b"]),
        rewards={"last_num": r_last_num, "exact": r_exact, "shaped": r_shaped_num},
        max_tokens=10,
    ),
    "add_sys": Candidate(
        name="add_sys",
        items=lambda: [(f"{a}+{b}", {"a": a, "b": b}) for a in range(1, 21) for b in range(1, 21)],
        user=lambda f: f"{f['a']} + {f['b']} =",
        answer=lambda f: str(f["a"] + f["b"]),
        rewards={"last_num": r_last_num, "exact": r_exact, "shaped": r_shaped_num},
        system="You are a calculator. Reply with only the result, a single number.",
        max_tokens=16,
    ),
    "larger": Candidate(
        name="larger",
        items=lambda: [(f"{a}>{b}", {"a": a, "b": b}) for a in range(10, 100) for b in range(10, 100)
                       if a != b and (a * 7 + b) % 9 == 0],
        user=lambda f: f"Which number is larger, {f['a']} or {f['b']}? Reply with only the number.",
        answer=lambda f: str(max(f["a"], f["b"])),
        rewards={"contains_only": lambda t, x: r_contains_only({**t, "other": str(min(t['a'], t['b']))}, x),
                 "exact": r_exact,
                 "shaped": lambda t, x: r_shaped_larger({**t, "other": str(min(t['a'], t['b']))}, x)},
        max_tokens=16,
    ),
    "parity": Candidate(
        name="parity",
        items=lambda: [(f"p{n}", {"n": n}) for n in range(10, 500)],
        user=lambda f: f"Is {f['n']} even or odd? Answer with one word.",
        answer=lambda f: "even" if f["n"] % 2 == 0 else "odd",
        rewards={"word": r_parity, "shaped": r_parity_shaped},
        max_tokens=12,
    ),
    "upper": Candidate(
        name="upper",
        items=lambda: [(f"u{w}", {"word": w}) for w in WORDS],
        user=lambda f: f"Write the word '{f['word']}' in capital letters. Reply with only the word.",
        answer=lambda f: f["word"].upper(),
        rewards={"contains": r_upper, "shaped": r_upper_shaped},
        max_tokens=12,
    ),
}


class ModuleCandidate:
    """A shipped task module (agentjet.tasks.<name>) seen through the Candidate interface."""

    def __init__(self, name: str) -> None:
        from agentjet.tasks import get_task

        self.mod = get_task(name)
        self.name = name
        self.rewards = {"module": self.mod.reward}
        self.max_tokens = self.mod.SAMPLING["max_tokens"]

    def tasks(self, split: str, n: int, seed: int) -> list[dict]:
        return self.mod.generate_tasks(split, n, seed)


def get_candidate(name: str):
    if name.startswith("module:"):
        return ModuleCandidate(name.split(":", 1)[1])
    return CANDIDATES[name]


# --------------------------------------------------------------------------- engine helpers
def make_engine(lr: float = 1e-5, seed: int = 0, max_batch_size: int = 8):
    from agentjet.engines.base import TrainConfig
    from agentjet.engines.hf import HFEngine

    return HFEngine("smollm2-135m-instruct", max_batch_size=max_batch_size,
                    train_config=TrainConfig(learning_rate=lr), seed=seed)


def prompt_ids(engine, messages: list[dict]) -> list[int]:
    return list(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                     return_dict=False))


async def rollout(engine, tasks: list[dict], temperature: float, max_tokens: int, seed0: int):
    from agentjet.engines.base import SamplingParams

    async def one(i, t):
        ids = prompt_ids(engine, t["messages"])
        res = await engine.generate(ids, SamplingParams(temperature=temperature, max_tokens=max_tokens,
                                                        seed=seed0 + i))
        return ids, res

    return await asyncio.gather(*[one(i, t) for i, t in enumerate(tasks)])


async def evaluate(engine, cand: Candidate, reward_name: str, tasks: list[dict], temperature: float,
                   max_tokens: int, seed0: int = 10_000) -> dict:
    outs = await rollout(engine, tasks, temperature, max_tokens, seed0)
    rfn = cand.rewards[reward_name]
    rs = [rfn(t, res.text) for t, (_, res) in zip(tasks, outs, strict=True)]
    all_r = {k: statistics.mean(f(t, res.text) for t, (_, res) in zip(tasks, outs, strict=True))
             for k, f in cand.rewards.items()}
    return {"reward": statistics.mean(rs), "all": all_r,
            "mean_len": statistics.mean(len(res.token_ids) for _, res in outs),
            "samples": [res.text for _, res in outs[:4]]}


def save_result(key: str, value) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[key] = value
    RESULTS.write_text(json.dumps(data, indent=2))


# --------------------------------------------------------------------------- phase: base rates
async def phase_base(args) -> None:
    engine = make_engine()
    names = args.tasks.split(",") if args.tasks else list(CANDIDATES)
    out = (json.loads(RESULTS.read_text()) if RESULTS.exists() else {}).get("base_rates", {})
    for name in names:
        cand = CANDIDATES[name]
        tasks = cand.tasks("train", args.n, seed=0)
        for temp in [float(x) for x in args.temps.split(",")]:
            t0 = time.perf_counter()
            mt = args.max_tokens or cand.max_tokens
            ev = await evaluate(engine, cand, next(iter(cand.rewards)), tasks, temp, mt, seed0=0)
            dt = time.perf_counter() - t0
            out[f"{name}@T{temp}"] = {**ev, "seconds": dt, "n": args.n, "max_tokens": mt}
            save_result("base_rates", out)
            rates = " ".join(f"{k}={v:.3f}" for k, v in ev["all"].items())
            print(f"{name:8s} T={temp:.1f} n={args.n} {rates} len={ev['mean_len']:.1f} {dt:.1f}s "
                  f"e.g. {ev['samples'][:2]!r}", flush=True)
    save_result("base_rates", out)
    await engine.close()


# --------------------------------------------------------------------------- phase: GRPO training
async def phase_train(args) -> None:
    from agentjet.algorithms import AdvantageEstimator, compute_advantages
    from agentjet.engines.base import TrainSample

    cand = get_candidate(args.task)
    rfn = cand.rewards[args.reward]
    engine = make_engine(args.lr, seed=args.seed)
    eval_tasks = cand.tasks("eval", args.n_eval, seed=0)
    max_tokens = args.max_tokens or cand.max_tokens
    train_pool = cand.tasks("train", 100_000 // 100, seed=args.seed)
    rng = random.Random(args.seed)
    key = args.key or f"train:{args.task}:{args.reward}:lr{args.lr:g}:G{args.group}xB{args.groups}:T{args.temp}:s{args.seed}"
    curve = []
    t_start = time.perf_counter()

    async def do_eval(step: int) -> None:
        t0 = time.perf_counter()
        ev = await evaluate(engine, cand, args.reward, eval_tasks, args.eval_temp, max_tokens)
        curve.append({"step": step, "elapsed": time.perf_counter() - t_start, "eval_reward": ev["reward"],
                      "eval_all": ev["all"], "eval_len": ev["mean_len"], "samples": ev["samples"][:2]})
        print(f"[eval] step={step} t={time.perf_counter() - t_start:.0f}s reward={ev['reward']:.3f} "
              f"all={ {k: round(v, 3) for k, v in ev['all'].items()} } len={ev['mean_len']:.1f} "
              f"({time.perf_counter() - t0:.1f}s) {ev['samples'][:2]!r}", flush=True)

    def summary(step: int) -> dict:
        return {"task": args.task, "reward": args.reward, "lr": args.lr, "group_size": args.group,
                "groups_per_batch": args.groups, "temperature": args.temp, "eval_temperature": args.eval_temp,
                "max_tokens": max_tokens, "n_eval": args.n_eval, "seed": args.seed, "steps": step,
                "wall_s": time.perf_counter() - t_start, "eval_before": curve[0]["eval_reward"],
                "eval_after": curve[-1]["eval_reward"], "eval_best": max(c["eval_reward"] for c in curve),
                "curve": curve, "steps_log": steps_log}

    steps_log: list[dict] = []
    if args.eval_greedy:
        greedy_before = await evaluate(engine, cand, args.reward, eval_tasks, 0.0, max_tokens)
        print(f"[greedy] before={greedy_before['reward']:.3f} {greedy_before['all']}", flush=True)
    t_start = time.perf_counter()
    await do_eval(0)
    step = 0
    while step < args.steps and time.perf_counter() - t_start < args.budget:
        step += 1
        t0 = time.perf_counter()
        groups = [train_pool[rng.randrange(len(train_pool))] for _ in range(args.groups)]
        flat = [t for t in groups for _ in range(args.group)]
        outs = await rollout(engine, flat, args.temp, max_tokens, seed0=rng.getrandbits(31))
        t_gen = time.perf_counter() - t0
        batch, rewards_all, kept = [], [], 0
        for g in range(args.groups):
            chunk = outs[g * args.group:(g + 1) * args.group]
            rs = [rfn(groups[g], res.text) for _, res in chunk]
            rewards_all += rs
            if max(rs) == min(rs):
                continue
            kept += 1
            for (ids, res), adv in zip(chunk, compute_advantages(rs, AdvantageEstimator.GRPO), strict=True):
                if not res.token_ids:
                    continue
                n_p, n_c = len(ids), len(res.token_ids)
                batch.append(TrainSample(input_ids=ids + res.token_ids, loss_mask=[0] * n_p + [1] * n_c,
                                         behaviour_logprobs=[0.0] * n_p + list(res.logprobs),
                                         advantages=[0.0] * n_p + [adv] * n_c, temperature=args.temp))
        metrics = {}
        if batch:
            metrics = await engine.train_step(batch)
        dt = time.perf_counter() - t0
        rec = {"step": step, "train_reward": statistics.mean(rewards_all), "kept_groups": kept,
               "gen_s": t_gen, "step_s": dt, "grad_norm": metrics.get("grad_norm"),
               "clip_frac": metrics.get("clip_frac"),
               "mean_len": statistics.mean(len(res.token_ids) for _, res in outs)}
        steps_log.append(rec)
        print(f"step {step:3d} train_r={rec['train_reward']:.3f} kept={kept}/{args.groups} "
              f"len={rec['mean_len']:.1f} gen={t_gen:.1f}s step={dt:.1f}s gn={rec['grad_norm']}", flush=True)
        if step % args.eval_every == 0:
            await do_eval(step)
            save_result(key, {**summary(step), "partial": True})
    if not curve or curve[-1]["step"] != step:
        await do_eval(step)
    if args.eval_greedy:
        greedy_after = await evaluate(engine, cand, args.reward, eval_tasks, 0.0, max_tokens)
        print(f"[greedy] before={greedy_before['reward']:.3f} after={greedy_after['reward']:.3f}", flush=True)
        greedy = {"before": greedy_before["reward"], "after": greedy_after["reward"],
                  "before_all": greedy_before["all"], "after_all": greedy_after["all"]}
    result = summary(step)
    if args.eval_greedy:
        result["greedy_eval"] = greedy
    print(f"DONE {key}: eval {result['eval_before']:.3f} -> {result['eval_after']:.3f} "
          f"(best {result['eval_best']:.3f}) in {step} steps, {result['wall_s']:.0f}s", flush=True)
    save_result(key, result)
    await engine.close()


def phase_table(_args) -> None:
    data = json.loads(RESULTS.read_text())
    print("== base rates ==")
    for k, v in data.get("base_rates", {}).items():
        print(f"{k:14s} n={v.get('n', 48)} " + " ".join(f"{n}={r:.3f}" for n, r in v["all"].items()) + f" len={v['mean_len']:.1f}")
    print("== GRPO runs ==")
    print(f"{'run':60s} {'before':>6s} {'after':>6s} {'best':>6s} {'steps':>5s} {'wall':>5s} {'greedy':>11s}")
    for k, v in data.items():
        if k.startswith("train:"):
            print(f"{k:60s} {v['eval_before']:6.3f} {v['eval_after']:6.3f} {v['eval_best']:6.3f} "
                  f"{v['steps']:5d} {v['wall_s']:5.0f} "
                  + (f"{v['greedy_eval']['before']:.2f}->{v['greedy_eval']['after']:.2f}" if "greedy_eval" in v
                     else f"{'-':>10s}")
                  + "  curve=" +
                  ",".join(f"{c['step']}:{c['eval_reward']:.2f}" for c in v["curve"]))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = default)")
    sub = p.add_subparsers(dest="phase", required=True)
    b = sub.add_parser("base")
    b.add_argument("--n", type=int, default=48)
    b.add_argument("--tasks", default="")
    b.add_argument("--temps", default="0.0,1.0")
    b.add_argument("--max-tokens", type=int, default=0)
    t = sub.add_parser("train")
    t.add_argument("--task", default="add")
    t.add_argument("--reward", default="shaped")
    t.add_argument("--lr", type=float, default=3e-5)
    t.add_argument("--group", type=int, default=8)
    t.add_argument("--groups", type=int, default=4)
    t.add_argument("--temp", type=float, default=1.0)
    t.add_argument("--eval-temp", type=float, default=0.0)
    t.add_argument("--max-tokens", type=int, default=0)
    t.add_argument("--n-eval", type=int, default=64)
    t.add_argument("--steps", type=int, default=200)
    t.add_argument("--budget", type=float, default=540.0)
    t.add_argument("--eval-every", type=int, default=5)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--key", default="")
    t.add_argument("--eval-greedy", action="store_true", help="also score the eval set greedily before/after")
    sub.add_parser("table")
    args = p.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.phase == "base":
        asyncio.run(phase_base(args))
    elif args.phase == "train":
        asyncio.run(phase_train(args))
    else:
        phase_table(args)


if __name__ == "__main__":
    sys.exit(main())
