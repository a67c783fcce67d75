"""Task sources. A built-in task module exposes ``generate_tasks(split, n, seed)``, ``reward(task, text)``,
``SAMPLING``, ``EVAL_SAMPLING`` and ``RECOMMENDED`` (a ``Recommended``); a multi-turn task also exposes the workflow
``async rollout(task, ep, sampling) -> reward``. ``get_task`` resolves every task name; the demo, ``ajet bench
--learn`` and the research trial client use it. Pure Python: no server imports."""

from __future__ import annotations

from agentjet.tasks import addition, calculator, lookup, toy
from agentjet.tasks.recommended import Recommended
from agentjet.tasks.source import TaskError, TaskSource

TASKS: dict[str, TaskSource] = {addition.NAME: addition, calculator.NAME: calculator, lookup.NAME: lookup,
                                toy.NAME: toy}
DEFAULT_TASK = addition.NAME


def get_task(name: str) -> TaskSource:
    """A built-in task by name; a ``TaskError`` (a ``ValueError``) says why a name does not resolve."""
    try:
        return TASKS[name]
    except KeyError:
        raise TaskError(f"unknown task {name!r}; built-in tasks: {sorted(TASKS)}") from None


__all__ = ["DEFAULT_TASK", "TASKS", "Recommended", "TaskError", "TaskSource", "addition", "calculator", "get_task",
           "lookup", "toy"]
