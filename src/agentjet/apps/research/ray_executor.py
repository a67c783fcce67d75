"""Trials on a Ray cluster: ``ajet research ... --ray ADDRESS`` (``auto``: the cluster of ``ray start`` on this
machine; ``local``: a Ray of this machine alone).

Each attempt is a named, detached Ray actor (:class:`TrialActor`) that reserves what the trial needs (the study's
``ray`` section: CPUs, GPUs per server, custom resources), so attempts spread over the cluster's nodes. On its node
the actor writes the attempt's `ajet up` spec (ports free there), starts `ajet up` in a scratch directory, answers
the server's status, and hands back the attempt's files as they grow (logs, ``evals.jsonl``, ``result.json``: not
the servers' data dirs). The driver writes them into the study's attempt directory, so the study state (``study.json``,
the Optuna study, the reports) stays with the driver.

- A node that dies takes its actor with it: the next poll says ``lost``, the study loop starts a new attempt, which
  Ray places on a node with room; the lost attempt is not counted as a crash and its points are dropped. `ajet up`
  runs with a parent-death signal, so the trial processes of an actor whose worker dies are stopped (and, where the
  node still answers, a reaper task kills what is left by pid and start time).
- The actors are detached and named (``study.json`` keeps each attempt's name): a driver that restarts finds them
  with ``ray.get_actor`` and re-attaches (its files are sent again from the start); an attempt whose actor is gone
  is retried.
- A finished or stopped attempt's actor sends its last files, removes its scratch directory (unless
  ``health.keep_checkpoints``) and is killed.

Every node needs AgentJet installed (the same version, importable by Ray's workers), as any Ray job does.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import httpx
import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from agentjet.apps.research.executor import (
    Chunk,
    FileSync,
    LocalExecutor,
    Look,
    TrialHandle,
    TrialTemplate,
    actor_name,
    apply_chunks,
    get_status,
)
from agentjet.apps.research.monitor import read_result
from agentjet.apps.research.process import TrialProcess, kill_if_same
from agentjet.apps.research.spec import StudySpecError
from agentjet.apps.research.state import Attempt, TrialRecord
from agentjet.protocol import ServerStatus

NAMESPACE = "agentjet-research"
POLL_WAIT_S = 1.0  # how long one poll waits for an actor's answer before the loop goes on (the answer is kept)


class TrialActor:
    """One attempt on its node (a Ray actor; a plain class, so it is tested without Ray)."""

    def __init__(self, name: str, scratch: str | None = None) -> None:
        self.dir = Path(scratch or tempfile.gettempdir()) / "agentjet-trials" / name
        self.proc: TrialProcess | None = None
        self.url = ""
        self.sync = FileSync(self.dir)
        self._http = httpx.Client(timeout=5.0)

    def launch(self, template: TrialTemplate, run: TrialRecord) -> dict[str, Any]:
        ports = template.prepare(run, self.dir)
        self.proc = TrialProcess.launch(self.dir / "trial.yaml", self.dir / "up.log", die_with_owner=True)
        self.url = template.url(ports[template.primary])
        ctx = ray.get_runtime_context() if ray.is_initialized() else None
        node_id = ctx.get_node_id() if ctx is not None else ""
        ip = ray.util.get_node_ip_address() if ctx is not None else "127.0.0.1"
        return {"pid": self.proc.pid, "create_time": self.proc.create_time, "port": ports[template.primary],
                "node": f"{ip} {node_id}".strip(), "dir": str(self.dir)}

    def poll(self, resync: bool = False) -> dict[str, Any]:
        if resync:
            self.sync.reset()
        if self.proc is None:
            return {"launched": False}
        status = get_status(self._http, self.url)
        self.proc.refresh_children()
        alive = self.proc.alive()
        return {"launched": True, "status": status, "alive": alive, "children": list(self.proc.children),
                "chunks": self.sync.changes()}

    def finish(self, grace_s: float, keep: bool) -> list[Chunk]:
        """Stop the attempt, send its last files, and remove its scratch directory (unless ``keep``)."""
        if self.proc is not None:
            self.proc.stop(grace_s)
        chunks = self.sync.changes()
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)
        return chunks


def _reap(processes: list[tuple[int, float]]) -> int:
    """On a node whose actor died: kill the attempt's processes that are left, by pid and start time."""
    for pid, created in processes:
        kill_if_same(pid, created)
    return len(processes)


def _short(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__


class RayHandle:
    def __init__(self, actor: Any, attempt_dir: Path, *, launch: Any = None, info: dict[str, Any] | None = None,
                 resync: bool = False, gone: str | None = None) -> None:
        self.actor = actor
        self.dir = attempt_dir
        self._launch = launch
        self._poll_ref: Any = None
        self._resync = resync
        self.info: dict[str, Any] = dict(info or {})
        self.children: list[tuple[int, float]] = list(self.info.pop("children", []) or [])
        self.gone = gone  # the actor is dead: why

    def poll(self) -> Look:
        if self.gone is not None:
            return Look(alive=False, lost=self.gone)
        if self._launch is not None:
            ready, _ = ray.wait([self._launch], timeout=0)
            if not ready:
                return Look(waiting="waiting for the cluster's resources")
            ref, self._launch = self._launch, None
            try:
                self.info = ray.get(ref)
            except RayTaskError as exc:  # the launch itself failed on the node: a crash, with its error in up.log
                with open(self.dir / "up.log", "a") as log:
                    log.write(f"the trial's actor could not launch `ajet up`:\n{exc}\n")
                return Look(alive=False)
            except RayActorError as exc:
                return self._dead(exc)
        if self._poll_ref is None:
            self._poll_ref = self.actor.poll.remote(self._resync)
            self._resync = False
        ready, _ = ray.wait([self._poll_ref], timeout=POLL_WAIT_S)
        if not ready:
            return Look()  # no answer yet: the stall and start rules apply as to a silent server
        ref, self._poll_ref = self._poll_ref, None
        try:
            out = ray.get(ref)
        except (ActorUnavailableError, RayTaskError):  # no answer this time; a trial that never answers stalls
            return Look()
        except RayActorError as exc:
            return self._dead(exc)
        if not out["launched"]:
            return Look(alive=False)
        self.children = [(int(pid), float(created)) for pid, created in out["children"]]
        apply_chunks(self.dir, out["chunks"])
        status: ServerStatus | None = out["status"]
        return Look(status=status, alive=bool(out["alive"]), result=read_result(self.dir))

    def _dead(self, exc: BaseException) -> Look:
        self.gone = f"its Ray actor died ({_short(exc)})"
        return Look(alive=False, lost=self.gone)

    def record(self, attempt: Attempt) -> bool:
        before = attempt.model_dump()
        if self.info:
            attempt.pid = self.info.get("pid", attempt.pid)
            attempt.create_time = self.info.get("create_time", attempt.create_time)
            attempt.port = self.info.get("port", attempt.port)
            attempt.node = self.info.get("node", attempt.node)
        attempt.children = list(self.children)
        return attempt.model_dump() != before

    def stop(self, grace_s: float, keep_checkpoints: bool) -> None:
        try:
            if self.gone is None and self._launch is None:
                chunks = ray.get(self.actor.finish.remote(grace_s, keep_checkpoints), timeout=grace_s + 60)
                apply_chunks(self.dir, chunks)
            elif self.gone is not None:
                self._reap_on_node()
        except (RayError, GetTimeoutError) as exc:
            self.gone = self.gone or f"its Ray actor died ({_short(exc)})"
            self._reap_on_node()
        finally:
            if self.actor is not None:
                with contextlib.suppress(RayError, ValueError):
                    ray.kill(self.actor, no_restart=True)

    def _reap_on_node(self) -> None:
        """The actor is dead. If its node still answers (only the worker died), kill the attempt's processes there
        (they also got a parent-death signal); a dead node took them with it."""
        node = str(self.info.get("node") or "").split()
        if len(node) != 2:
            return
        node_id = node[1]
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        if node_id not in alive:
            return
        pids = [(self.info["pid"], self.info["create_time"]), *self.children] if self.info.get("pid") else self.children
        reaper = ray.remote(num_cpus=0, max_retries=0)(_reap).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
        with contextlib.suppress(RayError, GetTimeoutError):
            ray.get(reaper.remote(pids), timeout=30)


def trial_demand(template: TrialTemplate) -> dict[str, Any]:
    """What one trial reserves: ``num_cpus``, ``num_gpus`` (per server times the servers), custom resources."""
    r = template.ray
    return {"num_cpus": r.cpus, "num_gpus": r.gpus_per_server * len(template.base.servers),
            "resources": dict(r.resources)}


def fits(demand: dict[str, Any], nodes: list[dict[str, Any]]) -> bool:
    """Whether some alive node's total resources hold one trial."""
    need = {"CPU": demand["num_cpus"], "GPU": demand["num_gpus"], **demand["resources"]}
    return any(all(node.get("Resources", {}).get(k, 0.0) >= v for k, v in need.items() if v)
               for node in nodes if node.get("Alive"))


def reachable(address: str, timeout_s: float = 5.0) -> None:
    """A ``host:port`` address that does not answer is refused at once (Ray itself retries it for minutes)."""
    host, sep, port = address.rpartition(":")
    if address in ("auto", "local") or "://" in address or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise StudySpecError(f"--ray {address}: no Ray cluster answers there ({exc})") from exc


class RayExecutor:
    name = "ray"

    def __init__(self, address: str) -> None:
        self.address = address
        reachable(address)
        try:
            ray.init(address=None if address == "local" else address, namespace=NAMESPACE, log_to_driver=False,
                     ignore_reinit_error=True, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise StudySpecError(f"--ray {address}: cannot connect to the Ray cluster ({_short(exc)})") from exc
        self._actor_cls: Any = ray.remote(TrialActor)
        self._local = LocalExecutor()  # attempts that an earlier session ran without --ray

    def check(self, template: TrialTemplate) -> None:
        demand = trial_demand(template)
        if not fits(demand, ray.nodes()):
            totals = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
            raise StudySpecError(f"no node of the Ray cluster holds one trial ({demand}; the nodes have {totals}): "
                                 "change the study's ray section (--ray-cpus, --ray-gpus-per-server)")

    def launch(self, template: TrialTemplate, run: TrialRecord, attempt: Attempt, attempt_dir: Path) -> TrialHandle:
        name = actor_name(run, attempt.number)
        demand = trial_demand(template)
        actor = self._actor_cls.options(name=name, namespace=NAMESPACE, lifetime="detached", max_restarts=0,
                                        max_task_retries=0, **demand).remote(name)
        attempt.actor = name
        return RayHandle(actor, attempt_dir, launch=actor.launch.remote(template, run))

    def attach(self, template: TrialTemplate, run: TrialRecord, attempt: Attempt, attempt_dir: Path) -> TrialHandle:
        if attempt.actor is None:
            return self._local.attach(template, run, attempt, attempt_dir)
        info = {"pid": attempt.pid, "create_time": attempt.create_time, "port": attempt.port, "node": attempt.node,
                "children": attempt.children}
        try:
            actor = ray.get_actor(attempt.actor, namespace=NAMESPACE)
        except ValueError:
            return RayHandle(None, attempt_dir, info=info, gone=f"its Ray actor {attempt.actor} is gone")
        if attempt.pid is None:  # the launch's answer never reached the study: start it again
            handle = RayHandle(actor, attempt_dir, info=info, gone="its launch was never confirmed")
            handle.stop(0.0, keep_checkpoints=False)
            return handle
        return RayHandle(actor, attempt_dir, info=info, resync=True)

    def close(self) -> None:
        self._local.close()
        if ray.is_initialized():
            ray.shutdown()
