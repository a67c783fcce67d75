"""Does an agent written on a harness SDK learn through the swarm? The lookup task (a table only its tool can read)
three ways at the same budget, back to back on this machine: the chat-completions agent (``lookup``), the OpenAI
Agents SDK's ``Runner.run`` on its default model, the Responses API (``lookup-agents``), and the Anthropic SDK's
``messages.create`` with tools (``lookup-anthropic``): ``agentjet.tasks.lookup_harness``.

    .venv/bin/python benchmarks/learning/harness_lookup.py                    # 20 min per arm, SmolLM2-135M
    .venv/bin/python benchmarks/learning/harness_lookup.py --minutes 1 --eval-tasks 8 --arms lookup-agents

Each arm is ``ajet demo --task ARM`` with the task's recommended settings (lr 2e-5, groups of 4, 2 groups a step,
its curriculum; early stopping off, so every arm spends its whole budget): the held-out success and the tool use
(tool-call share, correct-call share, turns) before training and after, on the same 48 held-out tables (or
``--eval-tasks``). Target (issue 48): held-out success +0.2 or more for the Agents SDK arm, beside the chat arm.
Results: benchmarks/results/harness_lookup.json (commit, machine), each arm's run in its own directory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # workloads.py

from workloads import RESULTS  # noqa: E402

from agentjet.runtime import provenance  # noqa: E402

ARMS = ("lookup", "lookup-agents", "lookup-anthropic")


def arm_settings(arm: str, args: argparse.Namespace) -> Any:
    """``ajet demo --task ARM`` at the budget, early stopping off, the task's recommendations for the rest."""
    from agentjet.apps.demo import DemoSettings
    from agentjet.client.settings import RunSettings

    return DemoSettings(model=args.model, task=arm, run=RunSettings(time_budget_s=60 * args.minutes),
                        eval_tasks=args.eval_tasks, early_stop=False, seed=args.seed, out_dir=args.out_dir / arm)


def run_arm(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    from agentjet.apps.demo import run_demo

    result = run_demo(arm_settings(arm, args))
    first, last = (result.tool_use[0], result.tool_use[-1]) if result.tool_use else ({}, {})
    return {"arm": arm, "success_before": result.eval_before, "success_after": result.eval_after,
            "gain": result.eval_after - result.eval_before, "train_steps": result.train_steps,
            "train_episodes": result.train_episodes, "failed_episodes": result.failed_episodes,
            "minutes": result.seconds / 60, "calls_per_sample": result.merge_ratio,
            "tool_call_share_before": first.get("tool_call_share"), "tool_call_share_after": last.get("tool_call_share"),
            "correct_call_share_before": first.get("correct_call_share"),
            "correct_call_share_after": last.get("correct_call_share"),
            "turns_before": first.get("turns_per_episode"), "turns_after": last.get("turns_per_episode"),
            "tool_use": result.tool_use, "evals": [e.model_dump() for e in result.evals],
            "stop_reason": result.stop_reason}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--minutes", type=float, default=20.0, help="each arm's training budget")
    p.add_argument("--eval-tasks", type=int, default=None, help="held-out tables (default: the task's 48)")
    p.add_argument("--arms", type=lambda s: s.split(","), default=list(ARMS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=ROOT / "runs" / "harness_lookup")
    p.add_argument("--output", type=Path, default=RESULTS / "harness_lookup.json")
    args = p.parse_args()
    rows = []
    for arm in args.arms:
        rows.append(run_arm(arm, args))
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("tool_use", "evals")}), flush=True)
    print(f"\n{'arm':18s} {'success':>15s} {'tool calls':>15s} {'correct calls':>15s} {'steps':>6s}")
    for r in rows:
        def pair(a: Any, b: Any) -> str:
            return f"{a:.2f} -> {b:.2f}" if a is not None and b is not None else "-"

        print(f"{r['arm']:18s} {pair(r['success_before'], r['success_after']):>15s} "
              f"{pair(r['tool_call_share_before'], r['tool_call_share_after']):>15s} "
              f"{pair(r['correct_call_share_before'], r['correct_call_share_after']):>15s} {r['train_steps']:6d}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"commit": provenance.git_commit(ROOT), "machine": provenance.machine(),
                                       "device": provenance.device(), "args": vars(args), "arms": rows},
                                      indent=2, default=str) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
