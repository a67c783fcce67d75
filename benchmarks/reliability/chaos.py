"""Chaos run: client and server SIGKILLs against the exactly-once invariant, for longer than the test.

    python benchmarks/reliability/chaos.py [--episodes 200] [--clients 6] [--kill-fraction 0.3] [--server-kills 1]

A real `ajet server --model tiny-random` process and `--clients` client processes (the harness of
`tests/chaos/`): `--kill-fraction` of the clients are SIGKILLed at random moments (and replaced), the
server is SIGKILLed `--server-kills` times (preferably right after a train step no checkpoint covers) and
restarted with `--resume`. At the end the server is stopped with SIGTERM and the clients' logs of
acknowledged episodes are audited against the store and the final checkpoint.

Prints the figures and saves benchmarks/results/chaos.json. Exits 1 if the audit found a problem.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))

from tests.chaos.harness import ChaosConfig, run_chaos  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = ChaosConfig()
    p.add_argument("--episodes", type=int, default=d.episodes, help="acknowledged episodes to reach")
    p.add_argument("--clients", type=int, default=d.clients, help="client processes")
    p.add_argument("--workers", type=int, default=d.workers, help="concurrent episodes per client process")
    p.add_argument("--kill-fraction", type=float, default=d.kill_fraction, help="share of clients SIGKILLed")
    p.add_argument("--server-kills", type=int, default=d.server_kills, help="server SIGKILL + --resume cycles")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--timeout", type=float, default=3600.0, help="give up after this many seconds")
    p.add_argument("--workdir", type=Path, default=None, help="keep the data dir and logs here (default: a temp dir)")
    p.add_argument("--out", type=Path, default=RESULTS / "chaos.json")
    args = p.parse_args()
    cfg = ChaosConfig(episodes=args.episodes, clients=args.clients, workers=args.workers,
                      kill_fraction=args.kill_fraction, server_kills=args.server_kills, seed=args.seed,
                      timeout_s=args.timeout)
    with tempfile.TemporaryDirectory(prefix="agentjet-chaos-") as tmp:
        workdir = args.workdir or Path(tmp)
        report = run_chaos(cfg, workdir, say=lambda msg: print(msg, flush=True))
    print()
    print(report.table())
    problems = report.problems()
    print("\naudit:", "OK" if not problems else "FAILED")
    for prob in problems:
        print("  -", prob)
    out = {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}",
           "command": "python benchmarks/reliability/chaos.py " + " ".join(sys.argv[1:]), **report.as_dict()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str))
    print(f"saved {args.out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
