"""A replica process on this machine: ``ajet generator --join <the fleet's loopback address> --name <name>``, a child
of the server (``runtime/proc.py``: its own session, its log file, SIGKILL when the fleet's thread that started it
dies), with its torch threads set. It dials in like any replica process (``remote.py``) and takes its weights by
path (the learner's export, in ``/dev/shm`` when it has room)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentjet.generators.fleet.remote import RemoteReplica
from agentjet.generators.fleet.wire import TOKEN_ENV, Hello, Init
from agentjet.runtime.proc import Child

STOP_GRACE_S = 5.0


def replica_command(join: str, name: str) -> list[str]:
    """The command line of a replica process (the secret goes in its environment: ``TOKEN_ENV``)."""
    return [sys.executable, "-m", "agentjet.cli", "generator", "--join", join, "--name", name]


def replica_env(token: str, threads: int | None, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env[TOKEN_ENV] = token
    if threads is not None:  # read when torch loads, before Init sets them again
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


class ProcessReplica(RemoteReplica):
    def __init__(self, name: str, init: Init, tokenizer: Any, weights_by_path: Callable[[Hello], bool], join: str,
                 token: str, log_path: Path) -> None:
        super().__init__(name, init, tokenizer, weights_by_path)
        self.join = join
        self.token = token
        self.log_path = log_path
        self.child: Child | None = None

    def where(self) -> str:
        return f"process {self.child.pid} on this machine" if self.child is not None else "a process on this machine"

    async def launch(self) -> None:
        # spawned on the fleet's loop thread, which lives as long as the fleet: the parent-death signal is the
        # spawning thread's
        self.child = Child.spawn(replica_command(self.join, self.name), self.log_path,
                                 env=replica_env(self.token, self.init.threads),
                                 header=f"\n==> agentjet: replica {self.name}", parent_death_signal=signal.SIGKILL)

    def process_alive(self) -> bool:
        return self.child is not None and self.child.alive()

    async def kill(self) -> None:
        child = self.child
        if child is not None:
            await asyncio.to_thread(child.stop, STOP_GRACE_S)
