"""The server's per-call cost of context tracking, and how it grows with the turns of an episode.

Per chat call the server builds the plain prompt (chat template + tokenize), then token-in/token-out: the prompt
with this agent's earlier replies put back as the ids it generated
(``agentjet.server.episodes.tito.request_prompt_ids``, in a worker thread), and records the call. At the end of
the episode context tracking turns the calls into samples (drift repair + timeline merging,
``agentjet.tracking.track_episode``). This benchmark runs exactly these functions, as ``server/episodes/ingest.py``
calls them, on linear tool-using episodes of T = 8, 32 and 128 turns (the episodes of
``benchmarks/tracking/timeline_merging.py``: SmolLM2 tokenizer, ChatML with tools; every resent reply was
generated with a non-canonical tokenization, so every request is spliced: the most work TITO can have; no model:
the replies are the episode's own, as the null engine serves canned ones). The recorded prompt of each call is
the spliced one, as on the server.

Reported per T, per call (means over the episode's calls; medians over the episodes: ``--rounds`` rounds, in
which the turn counts take turns so that load drift on a shared machine hits all of them, and a T-turn episode
is run max(T) / T times per round so that each T is measured over as many calls): tokens (prompt + reply),
the plain prompt (the server's work without tracking: what grows like the tokens), TITO at request time,
tracking at the end divided by T, their sum (the tracking cost of one call), and each one's ratio to T = 8.

``--baseline-commit REV`` runs the same measurement on that commit's library (a git worktree) in child processes
taking turns with this checkout's (old, new, new, old, ...), and checks that both produced the same prompts and
samples.

    .venv/bin/python benchmarks/serving/tito_cost.py          # ~2 min; writes benchmarks/results/tito_cost.json
    .venv/bin/python benchmarks/serving/tito_cost.py --baseline-commit 76c78eb       # ~7 min: before and after
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SRC_ENV = "AGENTJET_BENCH_SRC"  # a child measures the library under this path (the baseline's worktree)
sys.path.insert(0, os.environ.get(SRC_ENV, str(ROOT / "src")))
import agentjet  # noqa: E402,F401  (bound first: timeline_merging.py puts this checkout's src on the path too)

sys.path.insert(1, str(ROOT / "benchmarks" / "tracking"))  # timeline_merging.py
import timeline_merging as tm  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "tito_cost.json"
COSTS = ("plain_ms", "tito_ms", "track_ms", "tracking_ms")


@dataclasses.dataclass
class Server:
    """The parts of the server a call goes through, on one tokenizer."""

    tok: Any
    fmt: Any
    splice: Callable[..., Any]  # request_prompt_ids
    new_session: Callable[[], Any] | None  # a per-episode TITO state, where the library keeps one


def load_server() -> Server:
    from transformers import AutoTokenizer

    from agentjet.models import resolve_model
    from agentjet.server.episodes import tito
    from agentjet.server.episodes.chat import ChatFormatter

    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    tok.chat_template = tm.chatml_tools_template()
    session_cls = getattr(tito, "TitoSession", None)
    keeps_state = session_cls is not None and "session" in inspect.signature(tito.request_prompt_ids).parameters
    return Server(tok, ChatFormatter(tok), tito.request_prompt_ids,
                  (lambda: session_cls(tok)) if keeps_state and session_cls is not None else None)


def run_episode(srv: Server, shape: str, turns: int) -> dict[str, Any]:
    """One episode through the server's tracking path, every step timed."""
    calls = tm.EpisodeMaker(srv.tok, 7 + turns, drift_rate=1.0, tools=tm.SHAPES[shape]).linear(turns)
    session = srv.new_session() if srv.new_session is not None else None
    kw = {"session": session} if session is not None else {}
    recorded: list[Any] = []
    plain_s = tito_s = 0.0
    digest = hashlib.sha1()
    for c in calls:
        t0 = time.perf_counter()
        plain = srv.fmt.prompt_ids(c.messages, c.tools)
        t1 = time.perf_counter()
        ids, _outcome, _drift = srv.splice(srv.fmt, plain, list(recorded), c.agent, c.messages, c.tools, **kw)
        tito_s += time.perf_counter() - t1
        plain_s += t1 - t0
        recorded.append(dataclasses.replace(c, prompt_ids=list(ids)))  # the server records the spliced prompt
        digest.update(json.dumps(ids).encode())
    from agentjet.tracking import TrackingConfig, track_episode

    t0 = time.perf_counter()
    samples, report = track_episode(recorded, srv.tok, TrackingConfig())
    track_s = time.perf_counter() - t0
    for s in samples:
        digest.update(json.dumps([s.input_ids, s.loss_mask, s.behaviour_logprobs]).encode())
    n = len(calls)
    return {
        "shape": shape, "turns": turns, "messages_last_call": len(calls[-1].messages),
        "tokens_per_call": statistics.mean(len(c.prompt_ids) + len(c.completion_ids) for c in recorded),
        "tokens_last_call": len(recorded[-1].prompt_ids) + len(recorded[-1].completion_ids),
        "samples": len(samples), "drift_repaired_at_end": report.drift_repaired,
        "plain_ms": 1000 * plain_s / n, "tito_ms": 1000 * tito_s / n, "track_ms": 1000 * track_s / n,
        "tracking_ms": 1000 * (tito_s + track_s) / n, "digest": digest.hexdigest(),
        "session": session is not None,
    }


def run_round(srv: Server, shapes: list[str], turns: list[int], r: int) -> list[dict[str, Any]]:
    """Every (shape, T); the order of T rotates from round to round. A short episode is run max(T) / T times,
    so that every T is measured over about as many calls (a load spike on a shared machine would otherwise
    decide the T = 8 figures, the denominators of the ratios)."""
    k = r % len(turns)
    order = turns[k:] + turns[:k]
    rows = []
    for shape in shapes:
        for T in order:
            got = [run_episode(srv, shape, T) for _ in range(max(1, max(turns) // T))]
            print(f"  round {r} {shape} T={T} x{len(got)}: {got[0]['tokens_per_call']:.0f} tokens/call, tito "
                  f"{statistics.median(g['tito_ms'] for g in got):.1f} ms, track "
                  f"{statistics.median(g['track_ms'] for g in got):.1f} ms per call", file=sys.stderr, flush=True)
            rows += got
    return rows


def summarize(rows: list[dict[str, Any]], turns: list[int]) -> list[dict[str, Any]]:
    """Medians over the episodes of each (shape, T), with ratios to the smallest T of the same shape."""
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        base: dict[str, float] = {}
        for T in sorted(turns):
            got = [r for r in rows if r["shape"] == shape and r["turns"] == T]
            digests = {r["digest"] for r in got}
            assert len(digests) == 1, f"{shape} T={T}: the same episode gave different results"
            med = {k: statistics.median(r[k] for r in got) for k in ("tokens_per_call", *COSTS)}
            row = {**{k: got[0][k] for k in ("shape", "turns", "messages_last_call", "tokens_last_call", "samples",
                                             "digest", "session")}, **med, "episodes": len(got),
                   "all": {k: [r[k] for r in got] for k in COSTS}}
            base = base or {k: med[k] for k in med}
            row["ratio"] = {k: med[k] / base[k] for k in med}
            out.append(row)
    return out


def fmt_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| shape | T | tokens / call (× T=8) | plain prompt ms (×) | TITO ms (×) | end tracking ms (×) "
             "| tracking per call ms (×) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        q = r["ratio"]
        lines.append(f"| {r['shape']} | {r['turns']} | {r['tokens_per_call']:.0f} ({q['tokens_per_call']:.1f}×) "
                     f"| {r['plain_ms']:.1f} ({q['plain_ms']:.1f}×) | {r['tito_ms']:.1f} ({q['tito_ms']:.1f}×) "
                     f"| {r['track_ms']:.1f} ({q['track_ms']:.1f}×) "
                     f"| **{r['tracking_ms']:.1f}** ({q['tracking_ms']:.1f}×) |")
    return "\n".join(lines)


def child_rounds(args: argparse.Namespace, src: Path, r: int) -> list[dict[str, Any]]:
    env = {**os.environ, SRC_ENV: str(src)}
    cmd = [sys.executable, __file__, "--child", str(r), "--turns", *map(str, args.turns), "--shapes", *args.shapes]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"child on {src} failed:\n{out.stderr[-3000:]}")
    sys.stderr.write("".join(line + "\n" for line in out.stderr.splitlines() if line.startswith("  round")))
    rows: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return rows


def with_baseline(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Rounds of the baseline commit's library and this checkout's, taking turns in child processes."""
    wt = Path(tempfile.mkdtemp(prefix="aj-baseline-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(wt), args.baseline_commit], cwd=ROOT, check=True,
                   capture_output=True)
    sides = {"before": wt / "src", "after": ROOT / "src"}
    rows: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    try:
        for r in range(args.rounds):
            for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                print(f"round {r}: {side}", file=sys.stderr, flush=True)
                rows[side] += child_rounds(args, sides[side], r)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=ROOT, capture_output=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--shapes", nargs="+", choices=sorted(tm.SHAPES), default=["one_tool", "agent_tools"])
    ap.add_argument("--rounds", type=int, default=3, help="rounds, in which the turn counts take turns")
    ap.add_argument("--baseline-commit", default=None, help="measure this commit's library beside this checkout's")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)  # one round, rows as JSON on stdout
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(run_round(load_server(), args.shapes, args.turns, args.child)))
        return

    from agentjet.runtime.provenance import device, git_commit, machine

    t_start = time.perf_counter()
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "commit": git_commit(ROOT), "machine": machine(), "device": device(),
        "command": "python benchmarks/serving/tito_cost.py " + " ".join(sys.argv[1:]), "turns": args.turns,
        "rounds": args.rounds, "workload": "linear tool-using episodes of benchmarks/tracking/timeline_merging.py, "
        "every resent reply drifted (spliced), SmolLM2 tokenizer, ChatML with tools, no model",
    }
    if args.baseline_commit:
        sides = with_baseline(args)
        result["baseline_commit"] = args.baseline_commit
        result["before"] = summarize(sides["before"], args.turns)
        result["after"] = summarize(sides["after"], args.turns)
        same = [(b["shape"], b["turns"]) for b, a in zip(result["before"], result["after"], strict=True)
                if b["digest"] == a["digest"]]
        result["identical_prompts_and_samples"] = len(same) == len(result["after"])
        print(f"before ({args.baseline_commit}):\n{fmt_table(result['before'])}\n")
        print(f"after ({result['commit']}):\n{fmt_table(result['after'])}\n")
        print(f"identical prompts and samples before/after: {result['identical_prompts_and_samples']}")
    else:
        srv = load_server()
        rows = [row for r in range(args.rounds) for row in run_round(srv, args.shapes, args.turns, r)]
        result["after"] = summarize(rows, args.turns)
        print(fmt_table(result["after"]))
    result["load_avg"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    result["wall_s"] = time.perf_counter() - t_start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
