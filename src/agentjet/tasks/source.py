"""What a task source is: the interface every consumer of a task (the demo, ``ajet bench --learn``, the research
trial client, ``task_workflow``) reads. A built-in task module satisfies it with module-level names; a task
source built at run time (``rg:NAME``, ``agentjet.tasks.rg``) with attributes of an object. A multi-turn task
also has ``async rollout(task, ep, sampling) -> reward``, read with ``getattr``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from agentjet.tasks.recommended import Recommended

T = TypeVar("T")


def in_turn(orders: Mapping[str, Sequence[T]], n: int) -> list[tuple[str, T]]:
    """``n`` (name, item) pairs from the named orders in turn (equal shares, a mixture's task types), each order
    cycling when its share exceeds it."""
    names = list(orders)
    out = []
    for i in range(n):
        name = names[i % len(names)]
        out.append((name, orders[name][(i // len(names)) % len(orders[name])]))
    return out


class TaskError(ValueError):
    """A task name that does not resolve: unknown, badly written, or needing an extra that is not installed."""


class TaskSource(Protocol):
    NAME: str
    SAMPLING: dict[str, Any]
    EVAL_SAMPLING: dict[str, Any]
    RECOMMENDED: Recommended

    def generate_tasks(self, split: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` tasks from ``split`` ("train" or "eval"), deterministic in (split, n, seed)."""
        ...

    def reward(self, task: dict[str, Any], text: str) -> float:
        """The reward of one reply ``text`` to ``task``."""
        ...
