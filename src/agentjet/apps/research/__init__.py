"""Automated research: ``ajet research`` plans, runs, watches and reports RL experiments on the swarm.

Used only by the CLI; imports ``up``, ``client``, ``protocol`` and ``tasks``, and Optuna (the ``research``
extra) for planning. See docs/research.md.
"""

from agentjet.apps.research.spec import StudySpec, StudySpecError, load_study, spec_from_args

__all__ = ["StudySpec", "StudySpecError", "load_study", "spec_from_args"]
