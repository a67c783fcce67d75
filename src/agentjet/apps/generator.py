"""``ajet generator``: one generator replica in a process of its own, serving a swarm server's router (design §11).
It dials the server's join address with the fleet's secret (``generators/fleet/host.py``), takes the model and the
generator's settings from the server (``Init``), loads the model here (``--model``: this machine's copy of it;
``--device``, ``--threads``: where it runs), and serves token ids in, token ids and logprobs out, weight pushes and
pings until the server lets go. The server starts such processes itself for ``--generator-replicas N`` (on this
machine, or as Ray actors); a machine joins by hand with ``ajet generator --join HOST:PORT``."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from agentjet.generators.fleet.host import serve_replica
from agentjet.generators.fleet.replica import InProcessReplica
from agentjet.generators.fleet.wire import Init
from agentjet.layouts.fleet import hf_replica
from agentjet.settings import GeneratorSettings, PlacementSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Overrides:
    """What this machine says over the server's ``Init``: its own copy of the model, its device, its threads."""

    model: str | None = None
    device: str | None = None
    threads: int | None = None


def build(init: Init, own: Overrides) -> InProcessReplica:
    """The embedded generator the server's ``Init`` asks for (with this machine's overrides)."""
    import torch

    threads = own.threads or init.threads
    if threads is not None:
        torch.set_num_threads(threads)
    placement = PlacementSettings(device=own.device or init.device, dtype=init.dtype)
    return hf_replica(init.name, own.model or init.model, GeneratorSettings(**init.generator), placement)


def run_replica(join: str, token: str, name: str | None, own: Overrides, connect_timeout_s: float = 120.0) -> str:
    """Serve as a replica until the server lets go; returns why it ended."""
    from agentjet.runtime.omp import prefer_passive_openmp

    prefer_passive_openmp()  # before torch loads
    return asyncio.run(serve_replica(join, token, name, lambda init: build(init, own), connect_timeout_s))
