"""Timeline merging benchmark: tokens processed and train time per episode, merging on vs off.

Synthetic tool-using episodes with T = 1, 2, 4, 8, 16 calls (SmolLM2 tokenizer, a ChatML template with tools:
~150-token system prompt listing the tools, 30-80-token assistant turns with a Hermes tool call, 50-120-token
tool results, a final answer), recorded as the server records them (prompt ids = chat template applied; generated
ids = the reply's text re-encoded + <|im_end|>; one reply in ten spelled with a non-canonical tokenization so
that drift repair has work to do). Each episode goes through the real tracker (``track_episode``) and the real
``HFEngine("smollm2-135m-instruct").train_step_sync`` once with merging on and once with merging off (both with
drift repair and the default per-episode loss weights, so both steps see exactly the same trained tokens in
exactly the same contexts and compute the same loss).

Reported per T: samples per episode, processed tokens per episode (= the sum of the sample sequence lengths,
every token goes through forward + backward; the padded count of the engine's micro-batches is given too),
trained tokens, train wall time per episode, off/on ratios, tracker time. Plus a branching workload (T = 8, a
call forks the history with probability 0.2) with its merge rate.

    .venv/bin/python benchmarks/timeline_merging.py [--quick]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from agentjet.tracking import CallRecord, TrackingConfig, track_episode  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "timeline_merging.json"
DOC = ROOT / "docs" / "timeline_merging.md"
DOC_START, DOC_END = "<!-- results:start -->", "<!-- results:end -->"


def chatml_tools_template() -> str:
    """The ChatML-with-tools test fixture (SmolLM2's own template renders neither tools nor tool calls)."""
    spec = importlib.util.spec_from_file_location("tracking_templates", ROOT / "tests" / "tracking" / "templates.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CHATML_TOOLS


WORDS = ["the", "of", "and", "to", "in", "is", "for", "that", "on", "with", "as", "it", "by", "from", "at", "this", "be", "are", "or", "an", "was", "which", "can", "will", "have", "has", "not", "file", "data", "result", "value", "number", "list", "search", "query", "city", "weather", "price", "order", "user", "account", "report", "table", "row", "column", "status", "error", "code", "output", "input", "function", "call", "tool", "step", "plan", "check", "first", "next", "then", "finally", "found", "need", "use", "get", "set", "update", "create", "delete", "open", "read", "write", "return", "answer", "total", "sum", "average", "count", "date", "time", "page", "link", "title", "source", "item", "name", "id", "type", "key", "match", "best", "available", "current", "previous", "new", "old", "small", "large"]

TOOLS = [
    {"type": "function", "function": {
        "name": "lookup", "description": "Search a table or the knowledge base.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "table": {"type": "string"}},
                       "required": ["query"]}}},
]
SYSTEM = "You are a careful research assistant. Use the tools, check every number, then answer briefly."


class EpisodeMaker:
    def __init__(self, tok: Any, seed: int, drift_rate: float = 0.1) -> None:
        self.tok = tok
        self.rng = random.Random(seed)
        self.drift_rate = drift_rate
        self.eot = "<|im_end|>"

    def words(self, n: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(n))

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def reply(self, final: bool) -> dict[str, Any]:
        if final:
            return {"role": "assistant", "content": "Final answer: " + self.words(self.rng.randint(20, 50)) + "."}
        args = {"query": self.words(self.rng.randint(2, 6))}
        if self.rng.random() < 0.5:
            args["table"] = self.rng.choice(["orders", "users", "prices"])
        return {"role": "assistant", "content": self.words(self.rng.randint(6, 28)) + ".",
                "tool_calls": [{"id": f"call_{self.rng.getrandbits(32):08x}", "type": "function",
                                "function": {"name": "lookup", "arguments": json.dumps(args)}}]}

    def tool_result(self, call_id: str) -> dict[str, Any]:
        lines = [f"{i + 1}. {self.words(self.rng.randint(5, 12))} ({self.rng.randint(1, 9999)})"
                 for i in range(self.rng.randint(2, 4))]
        return {"role": "tool", "tool_call_id": call_id, "content": "\n".join(lines)}

    def call(self, index: int, messages: list[dict[str, Any]], reply: dict[str, Any]) -> CallRecord:
        tok = self.tok
        prompt_ids = list(tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
        prefix = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
        full = tok.apply_chat_template(messages + [reply], tools=TOOLS, add_generation_prompt=False, tokenize=False)
        rest = full[len(prefix):]
        text = rest[: rest.index(self.eot) + len(self.eot)]
        ids = self.encode(text)
        if self.rng.random() < self.drift_rate:  # the model spelled its first word letter by letter
            first = text.split(" ", 1)[0]
            spelled = [t for ch in first for t in self.encode(ch)]
            ids = spelled + self.encode(text[len(first):])
        return CallRecord(
            call_index=index, agent="agent", messages=copy.deepcopy(messages), tools=copy.deepcopy(TOOLS),
            prompt_ids=prompt_ids, completion_ids=ids,
            completion_logprobs=[-self.rng.random() * 2 for _ in ids], temperature=1.0, policy_version=0,
            response_message=copy.deepcopy(reply), finish_reason="stop",
        )

    def linear(self, turns: int) -> list[CallRecord]:
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "Question: " + self.words(self.rng.randint(10, 20)) + "?"}]
        calls = []
        for t in range(turns):
            reply = self.reply(final=t == turns - 1)
            calls.append(self.call(t, messages, reply))
            messages = messages + [reply]
            for tc in reply.get("tool_calls", []):
                messages.append(self.tool_result(tc["id"]))
        return calls

    def branching(self, turns: int, fork_p: float) -> tuple[list[CallRecord], int]:
        """Like ``linear`` but before a call, with probability ``fork_p``, the history is rewound to an earlier
        turn boundary (a forked history). Returns the calls and the ideal number of samples (the number of
        calls whose output no later call continues: the leaves of the call tree)."""
        base = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Question: " + self.words(self.rng.randint(10, 20)) + "?"}]
        history = list(base)
        cuts = [len(history)]  # turn boundaries of the current history
        producer: list[int | None] = [None, None]  # message -> call that generated it
        calls: list[CallRecord] = []
        continued: set[int] = set()
        for t in range(turns):
            if t > 0 and self.rng.random() < fork_p:
                k = self.rng.choice(cuts[:-1] or cuts)  # rewind to an earlier boundary
                history, producer = history[:k], producer[:k]
                cuts = [c for c in cuts if c <= k]
            continued.update(p for p in producer if p is not None)
            reply = self.reply(final=t == turns - 1)
            calls.append(self.call(t, history, reply))
            history = history + [reply]
            producer = producer + [t]
            for tc in reply.get("tool_calls", []):
                history.append(self.tool_result(tc["id"]))
                producer.append(None)
            cuts.append(len(history))
        leaves = sum(1 for c in calls if c.call_index not in continued)
        return calls, leaves


def padded_tokens(engine: Any, batch: list[Any]) -> int:
    return sum(max(len(s.input_ids) for s in mb) * len(mb) for mb in engine._micro_batches(batch))


def to_train(samples: list[Any]) -> list[Any]:
    from agentjet.engines.base import TrainSample

    return [TrainSample(s.input_ids, s.loss_mask, s.behaviour_logprobs,
                        [1.0 if m else 0.0 for m in s.loss_mask], s.temperature, s.weight) for s in samples]


def fmt_table(rows: list[dict[str, Any]]) -> str:
    head = ("| T | samples on / off | processed tokens on / off | token ratio | padded tokens on / off "
            "| trained tokens | train wall s on / off | wall ratio | train CPU s on / off | CPU ratio "
            "| CPU ratio w/o fixed step cost | tracker ms |")
    sep = "|---|---|---|---|---|---|---|---|---|---|---|---|"
    lines = [head, sep]
    for r in rows:
        lines.append(
            f"| {r['turns']} | {r['samples_on']:.0f} / {r['samples_off']:.0f} | {r['tokens_on']:.0f} / "
            f"{r['tokens_off']:.0f} | {r['token_ratio']:.2f}x | {r['padded_on']:.0f} / {r['padded_off']:.0f} | "
            f"{r['trained_tokens']:.0f} | {r['train_s_on']:.2f} / {r['train_s_off']:.2f} | "
            f"{r['time_ratio']:.2f}x | {r['train_cpu_s_on']:.1f} / {r['train_cpu_s_off']:.1f} | "
            f"{r['cpu_time_ratio']:.2f}x | "
            f"{'n/a' if r['cpu_ratio_excl_fixed'] is None else format(r['cpu_ratio_excl_fixed'], '.2f') + 'x'} | "
            f"{r['tracker_ms']:.0f} |")
    return "\n".join(lines)


def write_doc(rows: list[dict[str, Any]], branching: dict[str, Any], meta: dict[str, Any]) -> None:
    table = fmt_table(rows)
    b = branching
    text = (
        f"{DOC_START}\n"
        f"Measured by `benchmarks/timeline_merging.py{' --quick' if meta['quick'] else ''}` on {meta['machine']} "
        f"(torch threads: {meta['torch_threads']}, load average 1/5/15 min at the end: {meta['load_avg']}), "
        f"{meta['episodes_per_t']} episode(s) per T, SmolLM2-135M-Instruct, fp32, "
        f"micro-batches of {meta['micro_batch_tokens']} padded tokens. Processed tokens = the sum of the sample "
        f"sequence lengths of one episode (every one goes through forward and backward); padded = what the "
        f"engine's micro-batches compute. Train time = one `train_step_sync` per episode (forward, backward, "
        f"optimizer step; wall = elapsed, CPU = process CPU time of all threads, less sensitive to other "
        f"load on the machine), median over episodes. A train step has a fixed cost, measured on a 4-token sample: "
        f"{meta['fixed_step_cost']['wall_s']:.1f} s wall, {meta['fixed_step_cost']['cpu_s']:.1f} s CPU; the last "
        f"ratio removes it from both sides (the marginal cost, what counts when one step trains many episodes). "
        f"Total benchmark wall time: {meta['wall_s']:.0f} s.\n\n"
        f"{table}\n\n"
        f"Branching workload (T = {b['turns']}, each call forks the history with probability {b['fork_p']}, "
        f"{b['episodes']} episodes): {b['calls']} calls, {b['forks']} forks, {b['samples']} samples "
        f"(ideal: {b['ideal_samples']}, the leaves of the call trees), merge rate {b['merge_rate']:.2f} "
        f"(ideal {b['ideal_merge_rate']:.2f}), processed tokens {b['tokens_off']} -> {b['tokens_on']} "
        f"({b['token_ratio']:.2f}x), blocked: {b['blocked']}.\n"
        f"{DOC_END}"
    )
    doc = DOC.read_text() if DOC.exists() else f"# Timeline merging\n\n{DOC_START}\n{DOC_END}\n"
    if DOC_START in doc and DOC_END in doc:
        pre, rest = doc.split(DOC_START, 1)
        post = rest.split(DOC_END, 1)[1]
        doc = pre + text + post
    else:
        doc = doc.rstrip() + "\n\n" + text + "\n"
    DOC.write_text(doc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="T = 1, 2, 4, 8, one episode each (~2 minutes)")
    ap.add_argument("--turns", type=int, nargs="*", default=None)
    ap.add_argument("--episodes", type=int, default=1, help="episodes per T (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-doc", action="store_true", help="do not rewrite docs/timeline_merging.md")
    args = ap.parse_args()
    turns = args.turns or ([1, 2, 4, 8] if args.quick else [1, 2, 4, 8, 16])
    episodes = args.episodes

    import torch
    from transformers import AutoTokenizer

    from agentjet.engines.base import TrainConfig
    from agentjet.engines.hf import HFEngine
    from agentjet.models import resolve_model

    t_start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    tok.chat_template = chatml_tools_template()
    # a learning rate too small to move the weights: every step sees the same model, so the losses of the
    # merged and unmerged batches can be compared directly
    engine = HFEngine("smollm2-135m-instruct", train_config=TrainConfig(learning_rate=1e-12))
    engine.train_step_sync(to_train(track_episode(EpisodeMaker(tok, 999).linear(1), tok)[0]))  # warm-up
    # the per-step fixed cost (optimizer step, gradient allocation, ...): steps on a 4-token sample
    from agentjet.engines.base import TrainSample

    tiny = [TrainSample([1, 2, 3, 4], [0, 0, 1, 1], [-1.0] * 4, [0.0, 0.0, 1.0, 1.0])]
    fixed_wall, fixed_cpu = [], []
    for _ in range(2):
        t0, c0 = time.perf_counter(), time.process_time()
        engine.train_step_sync(tiny)
        fixed_wall.append(time.perf_counter() - t0)
        fixed_cpu.append(time.process_time() - c0)
    fixed = {"wall_s": statistics.median(fixed_wall), "cpu_s": statistics.median(fixed_cpu)}
    print(f"fixed cost of a train step: {fixed['wall_s']:.2f}s wall, {fixed['cpu_s']:.2f}s CPU", flush=True)
    on_cfg, off_cfg = TrackingConfig(merge=True), TrackingConfig(merge=False)

    rows = []
    for T in turns:
        acc: dict[str, list[float]] = {}
        for e in range(episodes):
            calls = EpisodeMaker(tok, args.seed * 1000 + T * 10 + e).linear(T)
            t0 = time.perf_counter()
            on, rep_on = track_episode(calls, tok, on_cfg)
            tracker_s = time.perf_counter() - t0
            off, rep_off = track_episode(calls, tok, off_cfg)
            b_on, b_off = to_train(on), to_train(off)
            # alternate the order so that background load hits both modes alike
            order = [("on", b_on), ("off", b_off)] if (e + T) % 2 == 0 else [("off", b_off), ("on", b_on)]
            res = {}
            for name, batch in order:
                t0, c0 = time.perf_counter(), time.process_time()
                stats = engine.train_step_sync(batch)
                res[name] = (time.perf_counter() - t0, stats, time.process_time() - c0)
            for key, val in {
                "samples_on": len(on), "samples_off": len(off),
                "tokens_on": rep_on.tokens_merged, "tokens_off": rep_off.tokens_merged,
                "padded_on": padded_tokens(engine, b_on), "padded_off": padded_tokens(engine, b_off),
                "trained_tokens": rep_on.trained_tokens,
                "train_s_on": res["on"][0], "train_s_off": res["off"][0],
                "train_cpu_s_on": res["on"][2], "train_cpu_s_off": res["off"][2],
                "loss_on": res["on"][1]["loss"], "loss_off": res["off"][1]["loss"],
                "tracker_ms": tracker_s * 1000, "drift_found": rep_on.drift_mismatches,
                "drift_repaired": rep_on.drift_repaired, "prompt_tokens_last_call": len(calls[-1].prompt_ids),
            }.items():
                acc.setdefault(key, []).append(float(val))
            print(f"T={T} episode {e}: samples {len(on)}/{len(off)} tokens {rep_on.tokens_merged}/"
                  f"{rep_off.tokens_merged} train {res['on'][0]:.2f}s/{res['off'][0]:.2f}s "
                  f"(cpu {res['on'][2]:.1f}s/{res['off'][2]:.1f}s) "
                  f"loss {res['on'][1]['loss']:.6f}/{res['off'][1]['loss']:.6f}", flush=True)
        row: dict[str, Any] = {"turns": T, "episodes": episodes}
        for key, vals in acc.items():
            row[key] = statistics.median(vals) if key.startswith("train_s") else statistics.mean(vals)
        row["token_ratio"] = row["tokens_off"] / row["tokens_on"]
        row["padded_ratio"] = row["padded_off"] / row["padded_on"]
        row["time_ratio"] = row["train_s_off"] / row["train_s_on"]
        row["cpu_time_ratio"] = row["train_cpu_s_off"] / row["train_cpu_s_on"]
        # the marginal ratio, per-step fixed cost removed (what matters when a step trains many episodes)
        var_on = row["train_cpu_s_on"] - fixed["cpu_s"]
        var_off = row["train_cpu_s_off"] - fixed["cpu_s"]
        row["cpu_ratio_excl_fixed"] = var_off / var_on if var_on > 0.1 * row["train_cpu_s_on"] else None
        row["loss_rel_diff"] = max(abs(a - b) / max(abs(b), 1e-12)
                                   for a, b in zip(acc["loss_on"], acc["loss_off"], strict=True))
        rows.append(row)

    # branching workload: tracker only
    fork_p, bT, n_b = 0.2, 8, 20
    tot = {"calls": 0, "samples": 0, "ideal": 0, "on": 0, "off": 0, "forks": 0}
    blocked: dict[str, int] = {}
    for e in range(n_b):
        maker = EpisodeMaker(tok, 10_000 + e)
        calls, leaves = maker.branching(bT, fork_p)
        samples, rep = track_episode(calls, tok, on_cfg)
        tot["calls"] += len(calls)
        tot["samples"] += len(samples)
        tot["ideal"] += leaves
        tot["on"] += rep.tokens_merged
        tot["off"] += rep.tokens_unmerged
        tot["forks"] += sum(1 for a, b in zip(calls, calls[1:], strict=False)
                            if len(b.messages) <= len(a.messages))
        for k, v in rep.blocked.items():
            blocked[k] = blocked.get(k, 0) + v
    branching = {
        "turns": bT, "fork_p": fork_p, "episodes": n_b, "calls": tot["calls"], "forks": tot["forks"],
        "samples": tot["samples"], "ideal_samples": tot["ideal"],
        "merge_rate": (tot["calls"] - tot["samples"]) / tot["calls"],
        "ideal_merge_rate": (tot["calls"] - tot["ideal"]) / tot["calls"],
        "tokens_on": tot["on"], "tokens_off": tot["off"], "token_ratio": tot["off"] / tot["on"],
        "blocked": dict(sorted(blocked.items())),
    }

    meta = {
        "quick": args.quick, "episodes_per_t": episodes, "machine": f"{os.cpu_count()} CPU cores "
        f"({platform.processor() or platform.machine()})", "torch_threads": torch.get_num_threads(),
        "load_avg": " ".join(f"{x:.1f}" for x in os.getloadavg()), "micro_batch_tokens":
        engine.config.micro_batch_tokens, "wall_s": time.perf_counter() - t_start,
        "processed_tokens": "sum of the sample sequence lengths per episode",
        "fixed_step_cost": fixed,
    }
    print()
    print(fmt_table(rows))
    print(f"\nbranching: {json.dumps(branching)}")
    print(f"max relative loss difference merged vs unmerged: {max(r['loss_rel_diff'] for r in rows):.2e}")
    print(f"total wall time {meta['wall_s']:.0f}s")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"meta": meta, "rows": rows, "branching": branching}, indent=2) + "\n")
    if not args.no_doc:
        write_doc(rows, branching, meta)


if __name__ == "__main__":
    main()
