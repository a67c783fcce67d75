"""Cocktail training: per-task-type shares of every batch.

Quotas are whole groups per batch: ``batch_groups`` is apportioned among the task types by their ratios
(largest remainder). The trainer composes each batch to the quotas; the begin path defers clients of a
type that already has enough episodes in flight, so no type floods the buffer.
"""

from __future__ import annotations

import math


def apportion(total: int, ratios: dict[str, float]) -> dict[str, int]:
    """Split ``total`` whole units by ``ratios`` (largest remainder; ties by name). Sums to ``total``."""
    if not ratios:
        return {}
    norm = sum(ratios.values())
    exact = {t: total * r / norm for t, r in ratios.items()}
    floors = {t: math.floor(x) for t, x in exact.items()}
    left = total - sum(floors.values())
    by_remainder = sorted(ratios, key=lambda t: (-(exact[t] - floors[t]), t))
    for t in by_remainder[:left]:
        floors[t] += 1
    return floors
