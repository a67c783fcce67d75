"""Replicas placed by a Ray cluster (``--ray ADDRESS``; the ``ray`` extra, as ``ajet research --ray`` uses it):
each replica is a Ray actor that reserves what one replica needs (``generator.fleet.cpus``, ``gpus``,
``resources``; spread over the nodes) and runs the replica process on its node (``ajet generator --join``, a child
that dies with the actor's worker). The replica dials the server's join address like any replica process.

A node that is lost takes its actor and its replica process with it: the replica's connection closes, it is out
of rotation at once, and its restart is a new actor, which Ray places on a node with room. Every node needs
AgentJet installed (the same version, importable by Ray's workers), as any Ray job does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError

from agentjet.generators.fleet.process import replica_command, replica_env
from agentjet.generators.fleet.remote import RemoteReplica
from agentjet.generators.fleet.wire import Hello, Init
from agentjet.runtime.proc import Child
from agentjet.settings import FleetSettings

log = logging.getLogger(__name__)

NAMESPACE = "agentjet-fleet"


class ReplicaActor:
    """One replica's process on its node (a Ray actor; a plain class, so it is tested without Ray)."""

    def __init__(self) -> None:
        self.child: Child | None = None

    def launch(self, name: str, join: str, token: str, threads: int | None) -> dict[str, Any]:
        log_path = Path(tempfile.gettempdir()) / "agentjet-replicas" / f"{name}.log"
        self.child = Child.spawn(replica_command(join, name), log_path, env=replica_env(token, threads),
                                 header=f"\n==> agentjet: replica {name} (Ray actor)", parent_death_signal=signal.SIGKILL)
        ctx = ray.get_runtime_context() if ray.is_initialized() else None
        node = ctx.get_node_id() if ctx is not None else ""
        ip = ray.util.get_node_ip_address() if ctx is not None else "127.0.0.1"
        return {"pid": self.child.pid, "node": node, "ip": ip, "log": str(log_path)}

    def alive(self) -> bool:
        return self.child is not None and self.child.alive()


class RayPlacement:
    """The server's connection to the cluster, and the actor class its replicas are made of."""

    def __init__(self, settings: FleetSettings) -> None:
        assert settings.ray is not None
        self.settings = settings
        address = settings.ray
        ray.init(address=None if address == "local" else address, namespace=NAMESPACE, log_to_driver=False,
                 ignore_reinit_error=True, configure_logging=False)
        self.actor_cls: Any = ray.remote(ReplicaActor)

    def node_ip(self) -> str:
        return str(ray.util.get_node_ip_address())

    def replica(self, name: str, init: Init, tokenizer: Any, weights_by_path: Callable[[Hello], bool], join: str,
                token: str) -> RayReplica:
        return RayReplica(name, init, tokenizer, weights_by_path, join, token, self)

    def new_actor(self) -> Any:
        s = self.settings
        return self.actor_cls.options(num_cpus=s.cpus, num_gpus=s.gpus, resources=dict(s.resources),
                                      scheduling_strategy="SPREAD", max_restarts=0, max_task_retries=0).remote()

    def close(self) -> None:
        if ray.is_initialized():
            ray.shutdown()


class RayReplica(RemoteReplica):
    def __init__(self, name: str, init: Init, tokenizer: Any, weights_by_path: Callable[[Hello], bool], join: str,
                 token: str, placement: RayPlacement) -> None:
        super().__init__(name, init, tokenizer, weights_by_path)
        self.join = join
        self.token = token
        self.placement = placement
        self.actor: Any = None
        self.info: dict[str, Any] = {}

    def where(self) -> str:
        if not self.info:
            return "a Ray actor (waiting for a node)"
        return f"Ray actor on node {self.info['ip']} ({self.info['node'][:8]}), process {self.info['pid']}"

    async def launch(self) -> None:
        """A new actor (Ray places it on a node with room; it waits while none has) starting the replica process."""
        self.info = {}
        self.actor = self.placement.new_actor()
        ref = self.actor.launch.remote(self.name, self.join, self.token, self.init.threads)
        self.info = await asyncio.wrap_future(ref.future())
        log.info("replica %s: %s", self.name, self.where())

    async def kill(self) -> None:
        """Kill the actor: its worker dies, and the replica process with it (its parent-death signal). Nothing
        waits for the actor's node: a lost node's actor may not be known dead for a while."""
        actor, self.actor = self.actor, None
        if actor is not None:
            with contextlib.suppress(RayError, ValueError):
                ray.kill(actor, no_restart=True)

