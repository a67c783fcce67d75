"""Process-level set-up for the processes that run torch (a server, an engine benchmark); a client-only
process is left as it is."""

from __future__ import annotations

import os


def prefer_passive_openmp() -> None:
    """Sleeping OpenMP waiters unless the user chose otherwise (``OMP_WAIT_POLICY=ACTIVE`` wins).

    A server shares its CPU with clients; spinning waiters make CPU inference collapse when another process
    holds a core (measured in docs/benchmarks.md). libgomp reads the variable when torch loads it, so call
    this before the first ``import torch``."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
