"""Training tasks drawn by difficulty level: per task type, its levels (a ``Ladder``, from the task source), the level
rule (``agentjet.schedule.levels.LevelRule``) and, within each level, the retirement of solved tasks
(``agentjet.schedule.Curriculum``, one per level).

    tasks = LevelledTasks(ladders, LevelSettings(window=8), pool_n=1024, curriculum=CurriculumSettings())
    key, task = tasks.draw()          # a train task at its type's current level (task["level"] says which)
    tasks.record(key, rewards)        # its group's rewards: retirement within the level, the level rule across
    tasks.levels()                    # {task type: level}
    tasks.eval_tasks(50)              # held-out tasks at each type's current level (unless it is the named one)

Task types take turns (a cocktail's types get equal shares of the groups, as the server's quotas ask); a type
without levels is not given here (the caller keeps it at its named task). Pure Python: the ladders are whatever
the caller passes (``agentjet.tasks.source.TaskLadder`` is one); nothing here imports a task module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from agentjet.schedule.curriculum import Curriculum, CurriculumSettings, TaskState
from agentjet.schedule.levels import LevelChange, LevelRule, LevelSettings


class LevelSource(Protocol):
    """What a level gives: its tasks (``generate_tasks``, as a task source's)."""

    def generate_tasks(self, split: str, n: int, seed: int = 0) -> list[dict[str, Any]]: ...


class Ladder(Protocol):
    """One task type's levels, ``0 .. top``: where training starts, which level (if any) the task as named is, and
    each level's task source."""

    @property
    def task_type(self) -> str: ...

    @property
    def top(self) -> int: ...

    @property
    def start(self) -> int: ...

    @property
    def named(self) -> int | None: ...

    def at(self, level: int) -> LevelSource: ...

    def label(self, level: int) -> str: ...


def distinct(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first task of each task id, in order."""
    seen: dict[str, dict[str, Any]] = {}
    for t in tasks:
        seen.setdefault(str(t["task_id"]), t)
    return list(seen.values())


class _Level:
    """One (task type, level): its train pool and its retirement (or a cycle through the pool)."""

    def __init__(self, task_type: str, level: int, pool: list[dict[str, Any]], curriculum: CurriculumSettings | None,
                 seed: int) -> None:
        if not pool:
            raise ValueError(f"level {level} of {task_type!r} has no train tasks")
        self.by_key = {str(t["task_id"]): {**t, "level": level} for t in pool}
        self.curriculum = Curriculum(self.by_key, curriculum, seed=seed) if curriculum is not None else None
        self._n = 0

    def draw(self) -> str:
        if self.curriculum is not None:
            return self.curriculum.draw()
        keys = list(self.by_key)
        self._n += 1
        return keys[(self._n - 1) % len(keys)]

    def solved_share(self) -> float | None:
        if self.curriculum is None:
            return None
        return self.curriculum.counts()[TaskState.SOLVED.value] / len(self.by_key)


class LevelledTasks:
    """See the module docstring. ``on_change`` hears every level move."""

    def __init__(self, ladders: Mapping[str, Ladder], settings: LevelSettings | None = None, *, pool_n: int = 1024,
                 curriculum: CurriculumSettings | None = None, seed: int = 0,
                 on_change: Callable[[LevelChange], None] | None = None) -> None:
        if not ladders:
            raise ValueError("no task type has levels")
        self.settings = settings or LevelSettings()
        self.ladders = dict(ladders)
        self.rules = {t: LevelRule(top=lad.top, start=lad.start, settings=self.settings, task_type=t)
                      for t, lad in self.ladders.items()}
        self.pool_n, self.curriculum, self.seed = pool_n, curriculum, seed
        self.on_change = on_change
        self.changes: list[LevelChange] = []
        self._levels: dict[tuple[str, int], _Level] = {}
        self._drawn: dict[str, tuple[str, int, str]] = {}  # draw key -> (type, level, pool key)
        self._types = list(self.ladders)
        self._turn = 0

    def _level(self, task_type: str, level: int) -> _Level:
        if (task_type, level) not in self._levels:
            pool = distinct(self.ladders[task_type].at(level).generate_tasks("train", self.pool_n, seed=self.seed))
            self._levels[(task_type, level)] = _Level(task_type, level, pool, self.curriculum, self.seed)
        return self._levels[(task_type, level)]

    # ------------------------------------------------------------ drawing and results
    def draw(self) -> tuple[str, dict[str, Any]]:
        """The next group's task: the next task type in turn, at its current level. The key is for ``record``."""
        task_type = self._types[self._turn % len(self._types)]
        self._turn += 1
        level = self.rules[task_type].level
        at = self._level(task_type, level)
        pool_key = at.draw()
        key = f"L{level}:{pool_key}"
        self._drawn.setdefault(key, (task_type, level, pool_key))
        return key, at.by_key[pool_key]

    def record(self, key: str, rewards: list[float]) -> LevelChange | None:
        """A finished group of the task drawn as ``key``: retirement at its level, then the level rule."""
        task_type, level, pool_key = self._drawn[key]
        at = self._levels[(task_type, level)]
        if at.curriculum is not None:
            at.curriculum.record(pool_key, rewards)
        change = self.rules[task_type].record(level, rewards, at.solved_share())
        if change is not None:
            self.changes.append(change)
            if self.on_change is not None:
                self.on_change(change)
        return change

    def release(self, key: str) -> None:
        """A drawn group that produced no result (every episode failed)."""
        task_type, level, pool_key = self._drawn[key]
        at = self._levels[(task_type, level)]
        if at.curriculum is not None:
            at.curriculum.release(pool_key)

    # ------------------------------------------------------------ where the run stands
    def levels(self) -> dict[str, int]:
        """Each task type's current level."""
        return {t: rule.level for t, rule in self.rules.items()}

    def highest(self) -> dict[str, int]:
        """Each task type's highest level reached."""
        return {t: rule.highest for t, rule in self.rules.items()}

    def counts(self) -> dict[str, int]:
        """Train tasks per retirement state, over the levels the types are at now."""
        out = {s.value: 0 for s in TaskState}
        for t, rule in self.rules.items():
            cur = self._level(t, rule.level).curriculum
            for state, n in (cur.counts() if cur is not None else {}).items():
                out[state] += n
        return out

    @property
    def exhausted(self) -> bool:
        """Every type at its top level with every task there retired: nothing left that a group could teach."""
        for t, rule in self.rules.items():
            cur = self._level(t, rule.level).curriculum
            if rule.level < rule.top or cur is None or not cur.exhausted:
                return False
        return True

    def eval_tasks(self, n_per_type: int) -> list[dict[str, Any]]:
        """``n_per_type`` held-out tasks of each type at its current level, tagged with it; none for a type whose
        current level is the task as named (the run's own held-out eval scores that one)."""
        out: list[dict[str, Any]] = []
        for t, rule in self.rules.items():
            if rule.level == self.ladders[t].named:
                continue
            out += [{**task, "level": rule.level, "index": i}  # index: the eval's fixed sampling seed per task
                    for i, task in enumerate(self.ladders[t].at(rule.level).generate_tasks("eval", n_per_type, seed=0))]
        return out

    def describe(self) -> dict[str, Any]:
        """The ladders and the moves so far, for a run's record."""
        return {"settings": self.settings.model_dump(),
                "ladders": {t: {"top": lad.top, "start": lad.start, "named": lad.named,
                                "labels": [lad.label(k) for k in range(lad.top + 1)]}
                            for t, lad in self.ladders.items()},
                "levels": self.levels(), "highest": self.highest(),
                "changes": [{"task_type": c.task_type, "old": c.old, "new": c.new, "move": c.move.value,
                             "reason": c.reason, "groups": c.groups} for c in self.changes]}
