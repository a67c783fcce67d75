"""CUDA graphs of the slot engine's forwards (``runner.py: SlotRunner``): one per bucket, ``("decode" | "prefill",
rows, window)``, captured on its first use and checked against the eager forward on its first replay; a bucket whose
graph cannot be captured, or disagrees, runs eagerly from then on. The control flow is tested on CPU with a fake
capture (tests/generators/test_continuous.py), the graphs themselves on CUDA (tests/layouts/test_engine_cuda.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

Bucket = tuple[str, int, int]  # ("decode" | "prefill", rows, window)


@dataclass
class Graph:
    graph: Any  # torch.cuda.CUDAGraph
    logits: torch.Tensor  # the graph's static output
    verified: bool = False


class GraphCache:
    """The graphs of one runner's buckets. ``stats``: the runner's counters (``graph_captures``, ``graph_replays``,
    ``graph_failures``), counted here."""

    def __init__(self, device: torch.device, stats: dict[str, int]) -> None:
        self.device = device
        self.stats = stats
        self.graphs: dict[Bucket, Graph] = {}
        self.eager: set[Bucket] = set()  # buckets whose graph failed: run eagerly
        self._pool: Any = None

    def clear(self) -> None:
        """Forget every graph (they read tensors that were replaced: the cache grew) and every failure."""
        self.graphs.clear()
        self.eager.clear()

    def replay(self, key: Bucket, step: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Replay the graph of ``key`` (``step``: the eager forward it captures), capturing it on first use. The
        first replay is checked against ``step`` run eagerly on the same inputs (both write the same cache columns
        with the same values, so running both is harmless); a bucket whose graph cannot be captured or disagrees
        runs eagerly from then on."""
        kind, n, w = key
        g = self.graphs.get(key)
        if g is None:
            try:
                g = self.capture(step)
            except Exception as exc:  # noqa: BLE001 - any capture failure: run this bucket eagerly
                log.warning("CUDA graph capture failed for a %s of %d rows x %d columns (%s: %s); running it eagerly",
                            kind, n, w, type(exc).__name__, exc)
                self.stats["graph_failures"] += 1
                self.eager.add(key)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                return step()
            self.graphs[key] = g
        g.graph.replay()
        self.stats["graph_replays"] += 1
        if not g.verified:
            eager = step()
            if not _close(g.logits, eager):
                log.warning("CUDA graph for a %s of %d rows x %d columns disagrees with the eager forward (max |diff| "
                            "%.3g); running it eagerly", kind, n, w, float((g.logits.float() - eager.float()).abs().max()))
                self.stats["graph_failures"] += 1
                self.graphs.pop(key)
                self.eager.add(key)
                return eager
            g.verified = True
        return g.logits

    def capture(self, step: Callable[[], torch.Tensor]) -> Graph:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: lazy initialisation, cuBLAS workspaces, compilation
                step()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = step()
        self.stats["graph_captures"] += 1
        return Graph(graph, logits)

def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Replayed and eager logits agree: the same kernels on the same inputs, so only reduction order differs."""
    tol = 1e-4 if a.dtype == torch.float32 else 5e-2
    a, b = a.float(), b.float()
    if a.shape != b.shape or not bool(torch.isfinite(a).all()):
        return False
    return bool(((a - b).abs() <= tol * (1 + b.abs())).all())
