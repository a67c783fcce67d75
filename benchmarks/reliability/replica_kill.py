"""A generator replica SIGKILLed in the middle of a run, under load: what the clients lose and how long the fleet
takes to mend.

    .venv/bin/python benchmarks/reliability/replica_kill.py                      # SmolLM2-135M-Instruct, 2 replicas
    .venv/bin/python benchmarks/reliability/replica_kill.py --model tiny-random  # quick

``ajet server --generator-replicas 2`` (engine processes, the cores split between them) runs the demo task
(``--episodes`` episodes, ``--concurrency`` at a time, training on: the harness of tests/fleet). Once
``--kill-after`` episodes have ended and replica r0 has calls in flight, its engine process is SIGKILLed. Reported:

- ``lost_episodes``: begun and not acknowledged, or acknowledged and neither trained, pending nor dropped (0);
- ``server_errors``: chat answers with a 5xx (0; the calls are plain HTTP without retries);
- ``out_of_rotation_s``: from the kill until the status shows r0 out of rotation;
- ``calls_flow_again_s``: from the kill until every call that was in flight at the kill has been answered (those
  on r0 went on on r1 from their tokens); ``first_answer_after_kill_s`` beside it;
- ``replica_serves_again_s``: from the kill until r0, restarted and brought to the newest weights, is in rotation;
- the router's ``failovers`` and ``failover_tokens``.
JSON with commit and machine in benchmarks/results/replica_kill.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # workloads.py
sys.path.insert(0, str(ROOT))  # tests/fleet/harness.py

import torch  # noqa: E402
from tests.fleet.harness import (  # noqa: E402
    demo_load,
    lost_episodes,
    replica_pid,
    replica_state,
    start_server,
    status,
    wait_status,
    when_busy,
)
from workloads import RESULTS, machine  # noqa: E402

from agentjet.models import resolve_model  # noqa: E402
from agentjet.runtime.provenance import git_commit  # noqa: E402
from agentjet.settings import ServerConfig  # noqa: E402

VICTIM = "r0"
GROUP = 8  # episodes per task: the server's group size
BATCH_GROUPS = 2  # groups per train step


async def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    load_task = asyncio.ensure_future(demo_load(url, args.episodes, args.concurrency, group_size=GROUP))
    await when_busy(url, VICTIM, args.kill_after, load_task)
    pid = replica_pid(await asyncio.to_thread(status, url), VICTIM)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    _, out_at = await asyncio.to_thread(wait_status, url, lambda s: replica_state(s, VICTIM) != "serving", 120,
                                        "the killed replica out of rotation", 0.02)
    load = await load_task
    in_flight = load.in_flight_at(killed)
    after = [c.end for c in load.calls if c.end > killed]
    return {"killed_pid": pid, "load": load, "killed": killed, "out_of_rotation_s": out_at - killed,
            "calls_in_flight_at_kill": len(in_flight),
            "calls_flow_again_s": max((c.end for c in in_flight), default=killed) - killed,
            "first_answer_after_kill_s": min(after, default=killed) - killed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--episodes", type=int, default=160)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--kill-after", type=int, default=32, help="episodes ended before the kill")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="CPU threads in all, split "
                   "between the two replicas")
    p.add_argument("--output", type=Path, default=RESULTS / "replica_kill.json")
    args = p.parse_args()
    path = resolve_model(args.model)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        config = ServerConfig.model_validate({
            "model": str(path), "data_dir": f"{tmp}/data", "log_level": "WARNING", "lease_seconds": 3600,
            "learner": {"learning_rate": 1e-5}, "training": {"group_size": GROUP, "batch_groups": BATCH_GROUPS, "checkpoint_every": 0},
            "generator": {"max_batch_size": args.concurrency, "replicas": 2, "fleet": {
                "threads": max(args.threads // 2, 1), "restart_backoff_s": 1.0, "health_interval_s": 1.0}}})
        server = start_server(config, Path(tmp), timeout=900, env={"OMP_NUM_THREADS": str(args.threads)})
        try:
            out = asyncio.run(run(server.url, args))
            _, back_at = wait_status(server.url, lambda s: replica_state(s, VICTIM) == "serving", 900,
                                     "the killed replica to serve again")
            # every episode closed, and what is pending less than a batch: a group left short (a member dropped as
            # stale) waits for a batch-mate that this finished load will not bring (it is counted, not lost)
            s, _ = wait_status(server.url, lambda s: s.buffer.open_episodes == 0
                               and s.buffer.pending_episodes < GROUP * BATCH_GROUPS, 900, "the last batch to train", 0.5)
        finally:
            server.stop(grace=60)
    load = out.pop("load")
    killed = out.pop("killed")
    victim = next(r for r in s.fleet.replicas if r.name == VICTIM) if s.fleet else None
    result = {"benchmark": "replica_kill", "command": " ".join(["benchmarks/reliability/replica_kill.py", *sys.argv[1:]]),
              "commit": git_commit(ROOT), "machine": machine(torch.device("cpu")), "model": args.model,
              "replicas": 2, "threads_per_replica": max(args.threads // 2, 1), "episodes": args.episodes,
              "concurrency": args.concurrency, "kill_after_episodes": args.kill_after,
              "lost_episodes": lost_episodes(load, s), "server_errors": load.server_errors,
              "statuses": {str(k): v for k, v in sorted(load.statuses.items())}, "failed": load.failed[:10],
              **out, "replica_serves_again_s": back_at - killed,
              "failovers": s.fleet.failovers if s.fleet else None,
              "failover_tokens": s.fleet.failover_tokens if s.fleet else None,
              "victim_restarts": victim.restarts if victim else None, "train_steps": s.train_steps,
              "trained_episodes": s.buffer.trained_episodes, "pending_episodes": s.buffer.pending_episodes,
              "dropped_stale_episodes": s.buffer.dropped_stale_episodes,
              "policy_version": s.policy_version, "seconds": time.time() - started}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
