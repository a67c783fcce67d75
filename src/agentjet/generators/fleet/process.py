"""The command line and environment of a replica process (``ajet generator --join <the fleet's join address> --name
<name>``) that something else starts on its machine: a Ray actor on its node (``ray_replicas.py``). The fleet's
secret goes in the environment, never on the command line; the torch threads too (read when torch loads)."""

from __future__ import annotations

import os
import sys

from agentjet.generators.fleet.wire import TOKEN_ENV


def replica_command(join: str, name: str) -> list[str]:
    """The command line of a replica process (the secret goes in its environment: ``TOKEN_ENV``)."""
    return [sys.executable, "-m", "agentjet.cli", "generator", "--join", join, "--name", name]


def replica_env(token: str, threads: int | None, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env[TOKEN_ENV] = token
    if threads is not None:  # read when torch loads, before Init sets them again
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env
