"""verifiers environments on the swarm (``ajet verifiers``, docs/environments.md): ``bridge`` starts the worker
in the verifiers venv, ``runner`` runs its episodes through the swarm, ``worker`` (run by path in that venv,
never imported here) runs verifiers."""

from agentjet.apps.verifiers.bridge import EpisodeOutcome, VerifiersWorker, WorkerError, WorkerOptions
from agentjet.apps.verifiers.runner import EpisodeRecord, VerifiersReport, run_verifiers

__all__ = ["EpisodeOutcome", "EpisodeRecord", "VerifiersReport", "VerifiersWorker", "WorkerError", "WorkerOptions",
           "run_verifiers"]
