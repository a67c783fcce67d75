"""The Tinker example loop beside ``ajet demo`` on the same task (single-digit addition), back to back on this
machine: held-out reward against wall-clock minutes (issue 35).

    .venv/bin/python benchmarks/learning/tinker_vs_demo.py                  # ~20 min: the demo, then the loop
    .venv/bin/python benchmarks/learning/tinker_vs_demo.py --quick          # plumbing: the tiny model, 2 steps

1. ``ajet demo`` (the task's recommended settings: full fine-tuning, lr 2e-5, its curriculum and stopping rule):
   its periodic held-out evals (the addition task's eval split, 44 episodes, temperature 0.7).
2. ``ajet server --lora-rank 8 --tinker-key ...`` and ``examples/tinker_rl_loop.py --steps 20 --lr 2e-4``
   (only the official SDK; GRPO-style advantages, ``importance_sampling`` loss, rank-8 LoRA): its held-out
   reward every 5 steps (its own split: 20 problems never trained on, 2 samples each, temperature 1).

The two evaluations are each side's own (the example imports nothing from AgentJet), so the curves show how each
learns, not a like-for-like score. Results: benchmarks/results/tinker_vs_demo.json and .png.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # workloads.py

import torch  # noqa: E402
from workloads import RESULTS, machine  # noqa: E402

KEY = "tml-bench-tinker-vs-demo"
LINE = re.compile(r"^(?:final, )?step (\d+) \(([\d.]+) min\): held-out reward ([\d.]+)$")


def run_demo(model: str, out_dir: Path, quick: bool) -> list[dict[str, float]]:
    cmd = [sys.executable, "-m", "agentjet.cli", "demo", "--model", model, "--out-dir", str(out_dir)]
    if quick:
        cmd += ["--steps", "2", "--eval-tasks", "4", "--eval-every-s", "0"]
    subprocess.run(cmd, check=True, cwd=ROOT, timeout=3600)
    data = json.loads((out_dir / "demo_result.json").read_text())
    from agentjet.observe.learncurve import curve_from_demo

    return [{"minutes": p.minutes or 0.0, "step": p.train_steps, "reward": p.reward}
            for p in curve_from_demo(data).points]


def run_tinker_loop(model: str, work: Path, steps: int, lr: float, quick: bool) -> tuple[list[dict[str, float]], str]:
    from agentjet.runtime.launch import ServerProcess, start_ready
    from agentjet.settings import ServerConfig

    def make(port: int) -> ServerProcess:
        config = ServerConfig.model_validate({"model": model, "port": port, "data_dir": str(work / "server"),
                                              "tinker_key": KEY, "learner": {"lora": {"rank": 8}}})
        return ServerProcess("tinker", config, work / "server.log", work / "server.yaml")

    server = start_ready(make)
    try:
        cmd = [sys.executable, str(ROOT / "examples" / "tinker_rl_loop.py"), "--base-url", server.url,
               "--api-key", KEY, "--steps", str(steps), "--lr", str(lr)]
        if quick:
            cmd += ["--batch", "2", "--group", "2", "--max-tokens", "3"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=True).stdout
    finally:
        server.stop(grace=60)
    points = [{"step": int(m[1]), "minutes": float(m[2]), "reward": float(m[3])}
              for m in (LINE.match(x.strip()) for x in out.splitlines()) if m]
    return points, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--steps", type=int, default=20, help="the Tinker loop's steps")
    p.add_argument("--lr", type=float, default=2e-4, help="the Tinker loop's learning rate (rank-8 LoRA)")
    p.add_argument("--quick", action="store_true", help="the tiny model, 2 steps each: plumbing only")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    if args.quick:
        args.model, args.steps = "tiny-random", 2
    out = args.output or RESULTS / f"tinker_vs_demo{'_quick' if args.quick else ''}.json"
    with tempfile.TemporaryDirectory(prefix="tinker-vs-demo-") as tmp:
        t0 = time.monotonic()
        demo = run_demo(args.model, Path(tmp) / "demo", args.quick)
        demo_s = time.monotonic() - t0
        print(f"demo: {[(round(x['minutes'], 2), round(x['reward'], 3)) for x in demo]}", flush=True)
        t1 = time.monotonic()
        loop, stdout = run_tinker_loop(args.model, Path(tmp), args.steps, args.lr, args.quick)
        loop_s = time.monotonic() - t1
        print(stdout, flush=True)
    result = {"machine": machine(torch.device("cpu")), "model": args.model,
              "demo": {"points": demo, "seconds": demo_s, "eval": "the addition task's eval split, 44 episodes, "
                       "temperature 0.7 (ajet demo's periodic evals)"},
              "tinker_loop": {"points": loop, "seconds": loop_s, "steps": args.steps, "lr": args.lr,
                              "eval": "20 held-out problems x 2 samples, temperature 1 (the example's own)"},
              "order": "demo first, then the Tinker loop, back to back in this process"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    from agentjet.observe.curveplot import Line, Panel, plot_curves

    panel = Panel([Line(xy=[(x["minutes"], x["reward"]) for x in demo], label="ajet demo (swarm, full weights)",
                        style={"marker": "s"}),
                   Line(xy=[(x["minutes"], x["reward"]) for x in loop],
                        label="examples/tinker_rl_loop.py (Tinker SDK, LoRA 8)", style={"marker": "o"})],
                  x="minutes", xlabel="wall-clock minutes (evals included)", ylabel="held-out reward (each side's own)",
                  ylim=(0, 1.02))
    plot_curves(panel, out.with_suffix(".png"), f"{args.model} on addition: the Tinker loop beside ajet demo",
                figsize=(8, 4.5), dpi=120)
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
