"""A model of the server's GIL contention, no torch: how long a "decode step" (Python work, then a wait that
releases the GIL, as a host sync on a GPU does) takes beside an "event loop" thread that spends Python time on each
request, at several GIL switch intervals. Numbers of the model, not of AgentJet (docs/benchmarks.md, GPU check,
second round).

    python benchmarks/serving/gil_model.py
"""

from __future__ import annotations

import argparse
import sys
import threading
import time


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def steps(n: int, python_ms: float, wait_ms: float) -> float:
    """Milliseconds per step: ``python_ms`` holding the GIL, then ``wait_ms`` without it."""
    t0 = time.perf_counter()
    for _ in range(n):
        busy(python_ms)
        time.sleep(wait_ms / 1000)
    return (time.perf_counter() - t0) / n * 1000


def event_loop(stop: threading.Event, per_request_ms: float, rate: float) -> None:
    while not stop.is_set():
        busy(per_request_ms)
        time.sleep(max(1 / rate - per_request_ms / 1000, 0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--step-python-ms", type=float, default=2.0)
    p.add_argument("--step-wait-ms", type=float, default=2.5)
    p.add_argument("--request-python-ms", type=float, default=5.0)
    p.add_argument("--requests-per-s", type=float, default=60.0)
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    for interval_ms in (5.0, 1.0, 0.5):
        sys.setswitchinterval(interval_ms / 1000)
        alone = steps(args.steps, args.step_python_ms, args.step_wait_ms)
        stop = threading.Event()
        loop = threading.Thread(target=event_loop, args=(stop, args.request_python_ms, args.requests_per_s))
        loop.start()
        try:
            beside = steps(args.steps, args.step_python_ms, args.step_wait_ms)
        finally:
            stop.set()
            loop.join()
        print(f"switch interval {interval_ms:g} ms: a step takes {alone:.2f} ms alone, {beside:.2f} ms beside the "
              f"loop ({beside / alone:.2f}x)")


if __name__ == "__main__":
    main()
