"""Task sources. A built-in task module exposes ``generate_tasks(split, n, seed)``, ``reward(task, text)``,
``SAMPLING``, ``EVAL_SAMPLING`` and ``RECOMMENDED`` (a ``Recommended``); a multi-turn task also exposes the workflow
``async rollout(task, ep, sampling) -> reward``. ``rg:NAME`` names a reasoning-gym dataset (or a mixture) built
at run time with the same interface (``agentjet.tasks.rg``, the ``rg`` extra); ``ta:GAME`` a TextArena game, a
multi-turn task played by the game runner (``agentjet.tasks.ta`` over ``agentjet.tasks.games``, the ``ta`` extra).
``get_task`` resolves every task name; the demo, ``ajet bench --learn`` and the research trial client use it.
``lookup-agents`` and ``lookup-anthropic`` are the lookup task with its agent on the OpenAI Agents SDK or the
Anthropic SDK (``agentjet.tasks.lookup_harness``).
Pure Python: no server imports."""

from __future__ import annotations

from agentjet.tasks import addition, calculator, games, lookup, lookup_harness, rg, ta, toy
from agentjet.tasks.recommended import Recommended
from agentjet.tasks.source import LevelledSource, TaskError, TaskLadder, TaskSource, ladders

TASKS: dict[str, TaskSource] = {addition.NAME: addition, calculator.NAME: calculator, lookup.NAME: lookup,
                                toy.NAME: toy, lookup_harness.AGENTS.NAME: lookup_harness.AGENTS,
                                lookup_harness.ANTHROPIC.NAME: lookup_harness.ANTHROPIC}
DEFAULT_TASK = addition.NAME


def get_task(name: str) -> TaskSource:
    """A built-in task by name, the reasoning-gym task source of ``rg:...`` or the TextArena game of ``ta:...``; a
    ``TaskError`` (a ``ValueError``) says why a name does not resolve."""
    if name.startswith(rg.PREFIX):
        return rg.load(name)
    if name.startswith(ta.PREFIX):
        return ta.load(name)
    try:
        return TASKS[name]
    except KeyError:
        raise TaskError(f"unknown task {name!r}; built-in tasks: {sorted(TASKS)}, rg:NAME for a reasoning-gym "
                        "dataset, or ta:GAME for a TextArena game") from None


__all__ = ["DEFAULT_TASK", "TASKS", "LevelledSource", "Recommended", "TaskError", "TaskLadder", "TaskSource",
           "addition", "calculator", "games", "get_task", "ladders", "lookup", "lookup_harness", "rg", "ta", "toy"]
