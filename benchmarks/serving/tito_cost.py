"""Cost of token-in/token-out at request time: building the prompt of a request that resends the agent's earlier
replies with their generated ids spliced in (``agentjet.server.episodes.tito.request_prompt_ids``), against the plain
prompt (chat template + tokenize), on the SmolLM2 tokenizer and the episodes of benchmarks/tracking/timeline_merging.py.
The server runs the splice in a worker thread, so it adds latency to that request but does not block others.

    .venv/bin/python benchmarks/serving/tito_cost.py      # a few seconds; prints a table, saves benchmarks/results/tito_cost.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks" / "tracking"))  # timeline_merging.py

import timeline_merging as tm  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from agentjet.models import resolve_model  # noqa: E402
from agentjet.runtime.provenance import device, git_commit, machine  # noqa: E402
from agentjet.server.episodes.chat import ChatFormatter  # noqa: E402
from agentjet.server.episodes.tito import TitoOutcome, request_prompt_ids  # noqa: E402


def median_ms(fn: Callable[..., Any], *args: Any, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    tok.chat_template = tm.chatml_tools_template()
    fmt = ChatFormatter(tok)
    rows = []
    for shape, tools in tm.SHAPES.items():
        for turns in (2, 8, 16):
            # drift_rate=1: every earlier reply was generated with a non-canonical tokenization, so every
            # resent reply must be spliced (the most work the splice can have)
            calls = tm.EpisodeMaker(tok, 7, drift_rate=1.0, tools=tools).linear(turns)
            last = calls[-1]
            plain = fmt.prompt_ids(last.messages, last.tools)
            ids, outcome, drift = request_prompt_ids(fmt, plain, calls[:-1], "agent", last.messages, last.tools)
            assert outcome is TitoOutcome.SPLICED and drift == turns - 1, (outcome, drift)
            rows.append({
                "shape": shape, "turns": turns, "messages": len(last.messages), "prompt_tokens": len(ids),
                "spliced_replies": drift,
                "plain_ms": median_ms(fmt.prompt_ids, last.messages, last.tools),
                "tito_ms": median_ms(request_prompt_ids, fmt, plain, calls[:-1], "agent", last.messages, last.tools),
            })
    table = Table(title="Token-in/token-out: prompt building per request (median of 7)")
    for col in ("shape", "T", "messages", "prompt tokens", "spliced replies", "plain ms", "with splice ms"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["shape"], str(r["turns"]), str(r["messages"]), str(r["prompt_tokens"]),
                      str(r["spliced_replies"]), f"{r['plain_ms']:.1f}", f"{r['tito_ms']:.1f}")
    Console().print(table)
    out = ROOT / "benchmarks" / "results" / "tito_cost.json"
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "commit": git_commit(ROOT), "machine": machine(),
                               "device": device(), "rows": rows}, indent=2) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
