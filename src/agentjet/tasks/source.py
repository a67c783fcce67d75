"""What a task source is: the interface every consumer of a task (the demo, ``ajet bench --learn``, the research
trial client, ``task_workflow``) reads. A built-in task module satisfies it with module-level names; a task
source built at run time (``rg:NAME``, ``agentjet.tasks.rg``) with attributes of an object. A multi-turn task
also has ``async rollout(task, ep, sampling) -> reward``, read with ``getattr``. A task source with difficulty
levels also has ``ladders() -> {task type: TaskLadder}`` (read with ``ladders(source)``, which gives none for a
source without levels)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class TaskLadder:
    """One task type's difficulty levels ``0 .. top`` (``agentjet.schedule.levels``): each level's task source
    (of that one task type), built on first use by ``make``; ``labels`` names each level's knobs. ``start`` is where
    training starts, ``named`` which level the task as named is (None: none of them, e.g. a reasoning-gym
    dataset at its default knobs, which no curriculum level equals)."""

    task_type: str
    labels: tuple[str, ...]
    make: Callable[[int], TaskSource]
    start: int = 0
    named: int | None = None
    _built: dict[int, TaskSource] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.labels or not 0 <= self.start <= self.top or not (self.named is None or 0 <= self.named <= self.top):
            raise ValueError(f"{self.task_type}: a ladder needs levels, and its start ({self.start}) and named level "
                             f"({self.named}) among them (0 .. {self.top})")

    @property
    def top(self) -> int:
        return len(self.labels) - 1

    def at(self, level: int) -> TaskSource:
        """The task source of ``level``."""
        if not 0 <= level <= self.top:
            raise ValueError(f"{self.task_type}: level {level} is not among its levels 0 .. {self.top}")
        if level not in self._built:
            self._built[level] = self.make(level)
        return self._built[level]

    def label(self, level: int) -> str:
        return self.labels[level]


def ladders(source: TaskSource) -> dict[str, TaskLadder]:
    """A task source's difficulty levels by task type (``ladders()``); none for a source without levels."""
    fn = getattr(source, "ladders", None)
    return dict(fn()) if fn is not None else {}


class LevelledSource:
    """The task source of a run with difficulty levels: a task at a level (``task["level"]``, of its task type's
    ladder) is scored by that level's source (``reward``, and a multi-turn task's ``rollout``); a task without a
    level, and everything else (``NAME``, ``SAMPLING``, ``generate_tasks``, ``EpisodeTrace``...), is the named
    source's."""

    def __init__(self, named: TaskSource, task_ladders: Mapping[str, TaskLadder]) -> None:
        self.named = named
        self.ladders = dict(task_ladders)

    def source_of(self, task: dict[str, Any]) -> TaskSource:
        level = task.get("level")
        ladder = self.ladders.get(str(task.get("task_type")))
        if level is None or ladder is None or level == ladder.named:
            return self.named
        return ladder.at(int(level))

    def reward(self, task: dict[str, Any], text: str) -> float:
        return self.source_of(task).reward(task, text)

    def __getattr__(self, name: str) -> Any:
        if name in ("named", "ladders"):  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        if name == "rollout" and hasattr(self.named, "rollout"):
            async def rollout(task: dict[str, Any], ep: Any, sampling: dict[str, Any], **kw: Any) -> float:
                source: Any = self.source_of(task)  # a multi-turn source (its ``rollout``)
                return float(await source.rollout(task, ep, sampling, **kw))

            return rollout
        return getattr(self.named, name)
