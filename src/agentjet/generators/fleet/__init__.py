"""The rollout fleet (design §11): N generator replicas behind one ``Generator`` (``fleet.py: FleetGenerator``),
the server's router. Each session's calls go to one replica, new sessions to the least-loaded (``router.py``); a
call whose replica dies or hangs goes on on another from the tokens it holds (``calls.py``, ``held.py``); every
weight push reaches each replica in rotation, and the served version is the one they all hold (``slots.py``,
``sync.py: FleetSync``); a replica that dies or stops answering is out of rotation within a stated bound and is
restarted (``health.py``). The replicas (``replica.py``): in the server's process (tests), engine processes on
this machine and vLLM servers (``layouts/fleet.py``), replica processes (``ajet generator``: ``wire.py``,
``host.py``, ``remote.py``) in Ray actors (``ray_replicas.py``, ``process.py``) or on machines that join by hand
(``remote.py: JoinedReplica``; ``ajet generator --join``). Settings: ``agentjet.settings.FleetSettings`` (``generator.fleet``)."""

from agentjet.generators.fleet.fleet import FleetGenerator
from agentjet.generators.fleet.replica import InProcessReplica, Replica, ReplicaDown, ReplicaState, Weights
from agentjet.generators.fleet.sync import FleetSync

__all__ = ["FleetGenerator", "FleetSync", "InProcessReplica", "Replica", "ReplicaDown", "ReplicaState", "Weights"]
