"""Task sources. A built-in task module exposes ``generate_tasks(split, n, seed)``, ``reward(task, text)``,
``SAMPLING``, ``EVAL_SAMPLING`` and ``RECOMMENDED`` (a ``Recommended``); a multi-turn task also exposes the workflow
``async rollout(task, ep, sampling) -> reward``. ``rg:NAME`` names a reasoning-gym dataset (or a mixture) built
at run time with the same interface (``agentjet.tasks.rg``, the ``rg`` extra). ``get_task`` resolves every task
name; the demo, ``ajet bench --learn`` and the research trial client use it. Pure Python: no server imports."""

from __future__ import annotations

from agentjet.tasks import addition, calculator, lookup, rg, toy
from agentjet.tasks.recommended import Recommended
from agentjet.tasks.source import TaskError, TaskSource

TASKS: dict[str, TaskSource] = {addition.NAME: addition, calculator.NAME: calculator, lookup.NAME: lookup,
                                toy.NAME: toy}
DEFAULT_TASK = addition.NAME


def get_task(name: str) -> TaskSource:
    """A built-in task by name, or the reasoning-gym task source of ``rg:...``; a ``TaskError`` (a ``ValueError``)
    says why a name does not resolve."""
    if name.startswith(rg.PREFIX):
        return rg.load(name)
    try:
        return TASKS[name]
    except KeyError:
        raise TaskError(f"unknown task {name!r}; built-in tasks: {sorted(TASKS)}, or rg:NAME for a reasoning-gym "
                        "dataset") from None


__all__ = ["DEFAULT_TASK", "TASKS", "Recommended", "TaskError", "TaskSource", "addition", "calculator", "get_task",
           "lookup", "rg", "toy"]
