"""One chaos client process (started and SIGKILLed by ``tests/chaos/harness.py``).

    python tests/chaos/client_proc.py --url URL --client-id ID --acked FILE --events FILE --stop FILE

Runs ``--workers`` episode loops with ``agentjet.SwarmClient`` until the stop file exists: begin an
episode on a random task, make 1-2 chat calls with a small ``max_tokens``, end with a random reward.
Every episode whose end came back ``acknowledged`` is appended to the ``--acked`` file (one id a line,
flushed and fsynced) only *after* the acknowledgement, so the file never claims more than the server
acknowledged. Any error (the server was killed, the key is unknown after its restart, the lease ran
out) just loses that episode, which was never acknowledged, and the loop begins a new one.
``--events`` gets one JSON line per join / acknowledgement / failure for the harness's report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from pathlib import Path

from agentjet import SwarmClient


class Logs:
    def __init__(self, acked: Path, events: Path) -> None:
        self._acked = open(acked, "a", encoding="utf-8")  # noqa: SIM115
        self._events = open(events, "a", encoding="utf-8")  # noqa: SIM115

    def acked(self, episode_id: str) -> None:
        self._acked.write(episode_id + "\n")
        self._acked.flush()
        os.fsync(self._acked.fileno())

    def event(self, **fields: object) -> None:
        self._events.write(json.dumps({"t": time.time(), **fields}) + "\n")
        self._events.flush()


async def worker(client: SwarmClient, logs: Logs, rng: random.Random, stop: Path, tasks: int) -> None:
    while not stop.exists():
        phase, began, eid = "begin", time.time(), None
        try:
            async with client.episode(task_id=f"task-{rng.randrange(tasks)}") as ep:
                eid, began, phase = ep.episode_id, time.time(), "call"
                n_calls = rng.randint(1, 2)
                for _ in range(n_calls):
                    a, b = rng.randrange(100), rng.randrange(100)
                    await client.request("POST", "/v1/chat/completions", key=ep.api_key, json={
                        "model": "chaos", "messages": [{"role": "user", "content": f"What is {a} + {b}?"}],
                        "max_tokens": rng.randint(2, 8), "temperature": 1.0})
                ep.reward(round(rng.random(), 3))
                phase = "end"
            res = ep.result
            assert res is not None
            if res.acknowledged:
                logs.acked(ep.episode_id)
                logs.event(ev="ack", eid=ep.episode_id, began=began, dup=res.duplicate, calls=n_calls)
            else:
                logs.event(ev="fail", eid=eid, began=began, phase=phase, err="not acknowledged")
        except Exception as exc:  # noqa: BLE001 - any failure loses this (unacknowledged) episode
            logs.event(ev="fail", eid=eid, began=began, phase=phase, err=f"{type(exc).__name__}: {exc}"[:300])
            await asyncio.sleep(0.05)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--client-id", required=True)
    p.add_argument("--acked", type=Path, required=True)
    p.add_argument("--events", type=Path, required=True)
    p.add_argument("--stop", type=Path, required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--tasks", type=int, default=6)
    p.add_argument("--retries", type=int, default=8, help="SDK retries (backoff 0.2 s doubling to 10 s)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    logs = Logs(args.acked, args.events)
    rng = random.Random(args.seed)
    # a stable client id: a replacement process's join releases the episodes its killed predecessor left open
    async with SwarmClient(args.url, client_id=args.client_id, retries=args.retries) as client:
        assert client._joined is not None
        logs.event(ev="join", released=client._joined.released_episodes, pid=os.getpid())
        await asyncio.gather(*[worker(client, logs, random.Random(rng.random()), args.stop, args.tasks)
                               for _ in range(args.workers)])
    logs.event(ev="exit")


if __name__ == "__main__":
    asyncio.run(main())
