"""The checkpoint layout, in one place: what a server's ``checkpoints/`` directory holds, for the server that
writes it (``agentjet.server.training.checkpoints``), the learners that fill each checkpoint, and ``ajet export``
that reads it.

    checkpoints/
      step-000012/              one directory per kept checkpoint, named by its train step
        agentjet_state.json     the learner's state: policy version, source model (LEARNER_STATE)
        trainer_state.json      the server's state: checkpointed counters, policy version (SERVER_STATE)
        agentjet_run.json       the model as the user named it and the public settings (RUN_INFO)
        ... weights             Hugging Face files (or an adapter, or the trainer group's shards)
      .step-000012.<pid>-<hex>.tmp/  a checkpoint being written (renamed in whole when complete)
      latest                    the name of the newest complete checkpoint (written by rename)
      best.json                 the checkpoint pinned as the run's best: its name and the eval that made it
                                so (BEST; written by rename; pruning never removes the step it names)

A checkpoint is complete when its ``SERVER_STATE`` file exists; everything else is ignored.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

LEARNER_STATE = "agentjet_state.json"
SERVER_STATE = "trainer_state.json"  # the name checkpoints always had (kept so old data directories resume)
RUN_INFO = "agentjet_run.json"
LATEST = "latest"
BEST = "best.json"
_STEP_DIR = re.compile(r"step-(\d{6,})$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def is_complete(path: Path) -> bool:
    return (path / SERVER_STATE).exists()


def complete_checkpoints(root: Path) -> list[Path]:
    """Every complete checkpoint under ``root``, oldest step first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if _STEP_DIR.match(p.name) and p.is_dir() and is_complete(p))


def step_dirs(root: Path) -> list[Path]:
    """Every step directory under ``root``, complete or not, oldest first (for pruning)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if _STEP_DIR.match(p.name) and p.is_dir())


def latest(root: Path) -> Path | None:
    """The checkpoint the ``latest`` pointer names, if it is complete."""
    pointer = root / LATEST
    if pointer.exists():
        path = root / pointer.read_text().strip()
        if is_complete(path):
            return path
    return None


def best(root: Path) -> dict[str, Any] | None:
    """The pin ``BEST`` names (``checkpoint``: the step directory's name, ``eval``, ``train_steps``,
    ``policy_version``, ``pinned_at``), if it names a complete checkpoint; else None."""
    try:
        pin = read_json(root / BEST)
    except (OSError, ValueError):  # written by rename, so only a hand edit can tear it
        return None
    name = pin.get("checkpoint")
    if not isinstance(name, str) or not _STEP_DIR.match(name) or not is_complete(root / name):
        return None
    return pin


def read_json(path: Path) -> dict[str, Any]:
    """A state file of a checkpoint ({} when the checkpoint has none: older checkpoints lack some)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def read_policy_version(path: Path) -> int:
    """The policy version a checkpoint directory's learner state records (0 when it records none)."""
    return int(read_json(Path(path) / LEARNER_STATE).get("policy_version", 0))
