"""Built-in demo tasks. Each task module exposes ``generate_tasks(split, n, seed)``, ``reward(task, text)``,
``SAMPLING``, ``EVAL_SAMPLING`` and ``RECOMMENDED`` (a ``Recommended``); a multi-turn task also exposes the workflow
``async rollout(task, ep, sampling) -> reward``. Pure Python: no server imports."""

from __future__ import annotations

from types import ModuleType

from agentjet.tasks import addition, calculator, lookup, toy
from agentjet.tasks.recommended import Recommended

TASKS: dict[str, ModuleType] = {addition.NAME: addition, calculator.NAME: calculator, lookup.NAME: lookup,
                              toy.NAME: toy}
DEFAULT_TASK = addition.NAME


def get_task(name: str) -> ModuleType:
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; built-in tasks: {sorted(TASKS)}") from None


__all__ = ["DEFAULT_TASK", "TASKS", "Recommended", "addition", "calculator", "get_task", "lookup", "toy"]
