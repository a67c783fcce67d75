"""Timeline merging benchmark: tokens processed and train time per episode, merging on vs off.

Synthetic tool-using episodes with T = 1, 2, 4, 8, 16 calls (SmolLM2 tokenizer, a ChatML template with tools:
~150-token system prompt listing the tools, 30-80-token assistant turns with a Hermes tool call, 50-120-token
tool results, a final answer), recorded as the server records them (prompt ids = chat template applied; generated
ids = the reply's text re-encoded + <|im_end|>; one reply in ten spelled with a non-canonical tokenization so
that drift repair has work to do). Each episode goes through the real tracker (``track_episode``) and the real
``embedded_engine("smollm2-135m-instruct").train_step`` once with merging on and once with merging off (both with
drift repair and the default per-episode loss weights, so both steps see exactly the same trained tokens in
exactly the same contexts and compute the same loss).

Reported per T: samples per episode, processed tokens per episode (= the sum of the sample sequence lengths,
every token goes through forward + backward; the padded count of the engine's micro-batches is given too),
trained tokens, train wall time per episode, off/on ratios, tracker time. Plus a branching workload (T = 8, a
call forks the history with probability 0.2) with its merge rate. How the tracker's cost per call grows at
T = 8, 32 and 128 (no train step, no model): ``benchmarks/serving/tito_cost.py``, on these episodes.

    .venv/bin/python benchmarks/tracking/timeline_merging.py [--quick]
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from agentjet.runtime.blocking import run_blocking  # noqa: E402
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

def _fn(name: str, description: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": required}}}


def _s(description: str, **kw: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **kw}


def _i(description: str) -> dict[str, Any]:
    return {"type": "integer", "description": description}


def _b(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


def _strings(description: str) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "string"}, "description": description}


LOOKUP = _fn("lookup", "Search a table or the knowledge base. Returns at most `limit` matching rows, best match "
             "first, each with its id, a one-line summary and a relevance score between 0 and 1.",
             {"query": _s("Free-text query; quote exact phrases."),
              "table": _s("Table to search.", enum=["orders", "users", "prices", "inventory", "tickets"]),
              "limit": _i("Maximum rows to return (1-50).")}, ["query"])
# The tool set of a typical research / data agent: what real function-calling system prompts look like.
AGENT_TOOLS = [
    LOOKUP,
    _fn("web_search", "Search the web. Returns titles, URLs and snippets of the top results. Use specific queries; "
        "prefer primary sources. Results may be outdated: check the date of each page.",
        {"query": _s("The search query."), "num_results": _i("How many results (1-10, default 5)."),
         "recency_days": _i("Only pages updated in the last N days.")}, ["query"]),
    _fn("fetch_page", "Download a web page and return its main text as Markdown, without navigation, ads or "
        "scripts. Long pages are cut at `max_chars`; use `offset` to read further.",
        {"url": _s("An http(s) URL returned by web_search or given by the user."),
         "max_chars": _i("Maximum characters to return (default 4000)."),
         "offset": _i("Character offset to start at.")}, ["url"]),
    _fn("run_python", "Run Python 3.11 code in a sandbox with numpy, pandas and matplotlib, and return stdout, "
        "stderr and the value of the last expression. No network access. State does not persist between calls. "
        "Time limit 30 seconds.", {"code": _s("The code to run."), "timeout_s": _i("Time limit in seconds (max 30).")},
        ["code"]),
    _fn("read_file", "Read a text file from the workspace. Returns numbered lines; use start and end to read part "
        "of a large file.", {"path": _s("Path relative to the workspace root."), "start": _i("First line (1-based)."),
                             "end": _i("Last line, inclusive.")}, ["path"]),
    _fn("write_file", "Create or overwrite a text file in the workspace. Parent directories are created. Returns "
        "the number of bytes written.", {"path": _s("Path relative to the workspace root."),
                                        "content": _s("The full new content of the file."),
                                        "append": _b("Append instead of overwriting.")}, ["path", "content"]),
    _fn("list_dir", "List the files and directories under a workspace path, with sizes and modification times.",
        {"path": _s("Directory path relative to the workspace root."), "recursive": _b("Descend into subdirectories."),
         "pattern": _s("Glob pattern to filter names, e.g. *.csv.")}, ["path"]),
    _fn("sql_query", "Run a read-only SQL query against the analytics database (PostgreSQL 15). Tables: orders(id, "
        "user_id, total, currency, created_at, status), users(id, name, country, signup_date), prices(sku, price, "
        "valid_from, valid_to). Returns at most 200 rows as CSV.",
        {"sql": _s("A single SELECT statement."), "params": _strings("Positional parameters for $1, $2, ...")},
        ["sql"]),
    _fn("calculator", "Evaluate an arithmetic expression exactly (integers and decimals, + - * / ** %, parentheses, "
        "round, min, max, sum). Use it for every number you report.",
        {"expression": _s("The expression, e.g. round(1234.5 * 1.07, 2)."),
         "precision": _i("Decimal places in the result.")}, ["expression"]),
    _fn("get_weather", "Current weather and a 3-day forecast for a city: temperature, precipitation, wind.",
        {"city": _s("City name, optionally with a country code, e.g. Paris, FR."),
         "units": _s("Unit system.", enum=["metric", "imperial"])}, ["city"]),
    _fn("convert_currency", "Convert an amount between currencies at the daily reference rate of a given date.",
        {"amount": {"type": "number", "description": "The amount to convert."}, "from": _s("ISO 4217 code, e.g. EUR."),
         "to": _s("ISO 4217 code, e.g. USD."), "date": _s("YYYY-MM-DD; default today.")}, ["amount", "from", "to"]),
    _fn("send_email", "Send an email on the user's behalf. Only use it when the user asked for it explicitly; "
        "confirm the recipients first.", {"to": _strings("Recipient addresses."), "subject": _s("Subject line."),
                                          "body": _s("Plain-text body."), "cc": _strings("Copy addresses.")},
        ["to", "subject", "body"]),
]
# Workload shapes: the same turns, with a one-tool system prompt or the full tool set (what the first prompt of
# a real function-calling agent weighs).
SHAPES: dict[str, list[dict[str, Any]]] = {"one_tool": [LOOKUP], "agent_tools": AGENT_TOOLS}
SYSTEM = "You are a careful research assistant. Use the tools, check every number, then answer briefly."


class EpisodeMaker:
    def __init__(self, tok: Any, seed: int, drift_rate: float = 0.1, tools: list[dict[str, Any]] | None = None) -> None:
        self.tok = tok
        self.tools = tools if tools is not None else [LOOKUP]
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
        prompt_ids = list(tok.apply_chat_template(messages, tools=self.tools, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
        prefix = tok.apply_chat_template(messages, tools=self.tools, add_generation_prompt=True, tokenize=False)
        full = tok.apply_chat_template(messages + [reply], tools=self.tools, add_generation_prompt=False, tokenize=False)
        rest = full[len(prefix):]
        text = rest[: rest.index(self.eot) + len(self.eot)]
        ids = self.encode(text)
        if self.rng.random() < self.drift_rate:  # the model spelled its first word letter by letter
            first = text.split(" ", 1)[0]
            spelled = [t for ch in first for t in self.encode(ch)]
            ids = spelled + self.encode(text[len(first):])
        return CallRecord(
            call_index=index, agent="agent", messages=copy.deepcopy(messages), tools=copy.deepcopy(self.tools),
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


def shape_summary(tok: Any, tools: list[dict[str, Any]], seed: int) -> dict[str, float]:
    """P: the first prompt's tokens; u: the tokens one turn adds (reply + tool result + template), mean."""
    calls = EpisodeMaker(tok, seed, tools=tools).linear(8)
    grow = [len(b.prompt_ids) - len(a.prompt_ids) for a, b in zip(calls, calls[1:], strict=False)]
    return {"tools": len(tools), "first_prompt_tokens": len(calls[0].prompt_ids),
            "turn_tokens": statistics.mean(grow)}


def write_doc(shapes: dict[str, dict[str, Any]], branching: dict[str, Any], meta: dict[str, Any]) -> None:
    b = branching
    parts = [
        f"{DOC_START}\n"
        f"Measured by `{meta['command']}` on {meta['machine']} (torch threads: {meta['torch_threads']}, load average "
        f"1/5/15 min at the end: {meta['load_avg']}), {meta['episodes_per_t']} episode(s) per T, "
        f"SmolLM2-135M-Instruct, fp32, micro-batches of {meta['micro_batch_tokens']} padded tokens. Processed tokens "
        f"= the sum of the sample sequence lengths of one episode (every one goes through forward and backward); "
        f"padded = what the engine's micro-batches compute. Train time = one `train_step` per episode "
        f"(forward, backward, optimizer step; wall = elapsed, CPU = process CPU time of all threads, less sensitive "
        f"to other load on the machine), median over episodes. A train step has a fixed cost, measured on a 4-token "
        f"sample: {meta['fixed_step_cost']['wall_s']:.1f} s wall, {meta['fixed_step_cost']['cpu_s']:.1f} s CPU; the "
        f"last ratio removes it from both sides (the marginal cost, what counts when one step trains many "
        f"episodes). Total benchmark wall time: {meta['wall_s']:.0f} s.\n"]
    for name, sh in shapes.items():
        info = sh["shape"]
        parts.append(
            f"\n**`{name}`**: {info['tools']} tool schema(s) in the system prompt; first prompt "
            f"P = {info['first_prompt_tokens']} tokens, a turn adds u = {info['turn_tokens']:.0f} tokens.\n\n"
            f"{fmt_table(sh['rows'])}\n")
    parts.append(
        f"\nBranching workload (`one_tool`, T = {b['turns']}, each call forks the history with probability "
        f"{b['fork_p']}, {b['episodes']} episodes): {b['calls']} calls, {b['forks']} forks, {b['samples']} samples "
        f"(ideal: {b['ideal_samples']}, the leaves of the call trees), merge rate {b['merge_rate']:.2f} "
        f"(ideal {b['ideal_merge_rate']:.2f}), processed tokens {b['tokens_off']} -> {b['tokens_on']} "
        f"({b['token_ratio']:.2f}x), blocked: {b['blocked']}.\n{DOC_END}")
    text = "".join(parts)
    doc = DOC.read_text() if DOC.exists() else f"# Timeline merging\n\n{DOC_START}\n{DOC_END}\n"
    if DOC_START in doc and DOC_END in doc:
        pre, rest = doc.split(DOC_START, 1)
        post = rest.split(DOC_END, 1)[1]
        doc = pre + text + post
    else:
        doc = doc.rstrip() + "\n\n" + text + "\n"
    DOC.write_text(doc)


def measure(engine: Any, tok: Any, tools: list[dict[str, Any]], turns: list[int], episodes: int, seed: int,
            fixed: dict[str, float], label: str) -> list[dict[str, Any]]:
    """Per T: the same episodes trained merged and unmerged (alternating which goes first)."""
    on_cfg, off_cfg = TrackingConfig(merge=True), TrackingConfig(merge=False)
    rows = []
    for T in turns:
        acc: dict[str, list[float]] = {}
        for e in range(episodes):
            calls = EpisodeMaker(tok, seed * 1000 + T * 10 + e, tools=tools).linear(T)
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
                stats = run_blocking(engine.train_step(batch))
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
            print(f"[{label}] T={T} episode {e}: samples {len(on)}/{len(off)} tokens {rep_on.tokens_merged}/"
                  f"{rep_off.tokens_merged} train {res['on'][0]:.2f}s/{res['off'][0]:.2f}s "
                  f"(cpu {res['on'][2]:.1f}s/{res['off'][2]:.1f}s) "
                  f"loss {res['on'][1]['loss']:.6f}/{res['off'][1]['loss']:.6f}", flush=True)
        row: dict[str, Any] = {"turns": T, "episodes": episodes}
        for key, vals in acc.items():
            row[key] = statistics.median(vals) if key.startswith("train_") else statistics.mean(vals)
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
    return rows


def branching_workload(tok: Any) -> dict[str, Any]:
    """Tracker only: T = 8 episodes where each call forks the history with probability 0.2."""
    fork_p, bT, n_b = 0.2, 8, 20
    on_cfg = TrackingConfig(merge=True)
    tot = {"calls": 0, "samples": 0, "ideal": 0, "on": 0, "off": 0, "forks": 0}
    blocked: dict[str, int] = {}
    for e in range(n_b):
        calls, leaves = EpisodeMaker(tok, 10_000 + e).branching(bT, fork_p)
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
    return {
        "turns": bT, "fork_p": fork_p, "episodes": n_b, "calls": tot["calls"], "forks": tot["forks"],
        "samples": tot["samples"], "ideal_samples": tot["ideal"],
        "merge_rate": (tot["calls"] - tot["samples"]) / tot["calls"],
        "ideal_merge_rate": (tot["calls"] - tot["ideal"]) / tot["calls"],
        "tokens_on": tot["on"], "tokens_off": tot["off"], "token_ratio": tot["off"] / tot["on"],
        "blocked": dict(sorted(blocked.items())),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="T = 1, 2, 4, 8, one episode each, one_tool shape only")
    ap.add_argument("--turns", type=int, nargs="*", default=None)
    ap.add_argument("--shapes", nargs="*", choices=sorted(SHAPES), default=None,
                    help="workload shapes (default: all; --quick: one_tool)")
    ap.add_argument("--episodes", type=int, default=1, help="episodes per T (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-doc", action="store_true", help="do not rewrite docs/timeline_merging.md")
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"results JSON (default {RESULTS.relative_to(ROOT)})")
    args = ap.parse_args()
    turns = args.turns or ([1, 2, 4, 8] if args.quick else [1, 2, 4, 8, 16])
    shape_names = args.shapes or (["one_tool"] if args.quick else list(SHAPES))

    import torch
    from transformers import AutoTokenizer

    from agentjet.engines.base import TrainSample
    from agentjet.layouts import embedded_engine
    from agentjet.models import resolve_model

    t_start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    tok.chat_template = chatml_tools_template()
    # a learning rate too small to move the weights: every step sees the same model, so the losses of the
    # merged and unmerged batches can be compared directly
    from agentjet.settings import LearnerSettings

    engine = embedded_engine("smollm2-135m-instruct", learner=LearnerSettings(learning_rate=1e-12))
    run_blocking(engine.train_step(to_train(track_episode(EpisodeMaker(tok, 999).linear(1), tok)[0])))  # warm-up
    # the per-step fixed cost (optimizer step, gradient allocation, ...): steps on a 4-token sample
    tiny = [TrainSample([1, 2, 3, 4], [0, 0, 1, 1], [-1.0] * 4, [0.0, 0.0, 1.0, 1.0])]
    fixed_wall, fixed_cpu = [], []
    for _ in range(2):
        t0, c0 = time.perf_counter(), time.process_time()
        run_blocking(engine.train_step(tiny))
        fixed_wall.append(time.perf_counter() - t0)
        fixed_cpu.append(time.process_time() - c0)
    fixed = {"wall_s": statistics.median(fixed_wall), "cpu_s": statistics.median(fixed_cpu)}
    print(f"fixed cost of a train step: {fixed['wall_s']:.2f}s wall, {fixed['cpu_s']:.2f}s CPU", flush=True)

    shapes: dict[str, dict[str, Any]] = {}
    for name in shape_names:
        info = shape_summary(tok, SHAPES[name], args.seed)
        print(f"shape {name}: {info}", flush=True)
        rows = measure(engine, tok, SHAPES[name], turns, args.episodes, args.seed, fixed, name)
        shapes[name] = {"shape": info, "rows": rows}
    branching = branching_workload(tok)

    meta = {
        "quick": args.quick, "command": "python benchmarks/tracking/timeline_merging.py " + " ".join(sys.argv[1:]),
        "episodes_per_t": args.episodes, "machine": f"{os.cpu_count()} CPU cores "
        f"({platform.processor() or platform.machine()})", "torch_threads": torch.get_num_threads(),
        "load_avg": " ".join(f"{x:.1f}" for x in os.getloadavg()), "micro_batch_tokens":
        engine.learner.config.micro_batch_tokens, "wall_s": time.perf_counter() - t_start,
        "processed_tokens": "sum of the sample sequence lengths per episode",
        "fixed_step_cost": fixed,
    }
    meta["command"] = meta["command"].strip()
    print()
    for name, sh in shapes.items():
        print(f"{name}: {sh['shape']}")
        print(fmt_table(sh["rows"]))
        print()
    print(f"branching: {json.dumps(branching)}")
    print("max relative loss difference merged vs unmerged: "
          f"{max(r['loss_rel_diff'] for sh in shapes.values() for r in sh['rows']):.2e}")
    print(f"total wall time {meta['wall_s']:.0f}s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "shapes": shapes, "branching": branching}, indent=2) + "\n")
    if not args.no_doc:
        write_doc(shapes, branching, meta)


if __name__ == "__main__":
    main()
