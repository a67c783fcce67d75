"""Chaos harness: a real ``ajet server`` process, client processes, SIGKILLs, and an exactly-once audit.

``run_chaos(ChaosConfig(...), workdir)``:

1. starts ``ajet server --model tiny-random`` on a free loopback port with ``<workdir>/data`` as its data dir;
2. starts ``clients`` processes (``client_proc.py``), each appending the ids of the episodes whose end was
   *acknowledged* to its own log (fsynced, written only after the acknowledgement);
3. while the acknowledged count grows to ``episodes``: SIGKILLs ``kill_fraction`` of the clients at random
   moments (a replacement with the same client id takes over, so its join releases the leftovers), and
   SIGKILLs the server ``server_kills`` times, preferably right after a train step that no checkpoint
   covers yet (so resume must rewind), restarting it with ``--resume`` on the same data dir;
4. stops the clients (stop file), stops the server with SIGTERM (it checkpoints on stop), and audits the
   client logs against the store (SQLite) and the final checkpoint.

The audit, in ``ChaosReport.problems()``: every acknowledged id is in the store (zero lost), no id is
acknowledged twice, every acknowledged episode is trained / pending / dropped exactly once, each recorded
train step consumed exactly the episodes that point at it, nothing is consumed by a step newer than the
final checkpoint (the surviving model lineage), and training continued after every restart.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import sqlite3
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from agentjet.runtime.proc import Child

CLIENT_SCRIPT = Path(__file__).with_name("client_proc.py")


@dataclass
class ChaosConfig:
    episodes: int = 200  # stop once this many episodes were acknowledged (union of the client logs)
    clients: int = 6
    workers: int = 2  # concurrent episodes per client process
    kill_fraction: float = 0.3  # share of the clients SIGKILLed (each replaced at once)
    server_kills: int = 1
    tasks: int = 6  # task ids (GRPO groups form per task)
    model: str = "tiny-random"
    engine: str = "hf"
    group_size: int = 2
    batch_groups: int = 2
    checkpoint_every: int = 2
    lease_seconds: float = 3.0
    lr: float = 1e-3
    max_staleness: int = 1000
    client_retries: int = 8
    seed: int = 0
    timeout_s: float = 600.0
    uncheckpointed_wait_s: float = 15.0  # how long a server kill waits for a step no checkpoint covers
    server_threads: int = 1  # torch threads in the server (the tiny model gains nothing from more)


@dataclass
class ServerKill:
    at_acked: int
    t_kill: float = 0.0
    downtime_s: float = 0.0
    open_episodes: int = -1  # open episodes (server status) just before the kill
    steps_before: int = 0  # last train step in the store at the kill
    checkpoint_step: int = 0  # the step of the checkpoint the restart resumed from
    rewound_episodes: int = 0  # consumed after that checkpoint: pending again after the restart
    steps_after_restart: int = 0  # train steps the restarted server reported once ready
    lost_in_flight: int = 0  # begun before the kill, failed on the client after it (never acknowledged)
    acked_across: int = 0  # begun before the kill, acknowledged after it
    acked_as_duplicate: int = 0  # stored before the kill, acknowledgement lost, retried end -> duplicate ack


@dataclass
class ChaosReport:
    config: ChaosConfig
    wall_s: float = 0.0
    acked: int = 0
    acked_lines: int = 0
    duplicates_in_logs: int = 0
    lost: int = 0  # acknowledged but not in the store
    stored: int = 0
    stored_unacked: int = 0  # in the store, never logged by a client (killed after the commit, or end lost)
    status_of_acked: dict[str, int] = field(default_factory=dict)
    consumed_twice: int = 0
    beyond_final_step: int = 0  # consumed by a step the final checkpoint does not include
    step_count_mismatches: int = 0  # steps whose recorded episode count != episodes pointing at it
    orphan_consumed_steps: int = 0  # consumed_step pointing at no recorded step
    calls_mismatches: int = 0  # acknowledged, but stored with other than the client's calls (or no samples)
    final_step: int = 0
    final_checkpoint_step: int = -1
    final_policy_version: int = -1
    client_kills: int = 0
    planned_client_kills: int = 0
    client_processes: int = 0
    client_crashes: int = 0  # client processes that exited on their own (restarted too)
    released_on_rejoin: int = 0
    client_failures: dict[str, int] = field(default_factory=dict)  # phase -> failed episodes
    server_kills: list[ServerKill] = field(default_factory=list)
    server_exit_code: int | None = None
    workdir: str = ""

    # ------------------------------------------------------------------ verdicts
    @property
    def trained(self) -> int:
        return self.status_of_acked.get("trained", 0)

    @property
    def pending(self) -> int:
        return self.status_of_acked.get("pending", 0)

    @property
    def dropped(self) -> int:
        return sum(v for k, v in self.status_of_acked.items() if k.startswith("dropped"))

    def problems(self) -> list[str]:
        out = []
        if self.acked < self.config.episodes:
            out.append(f"only {self.acked} episodes acknowledged (wanted {self.config.episodes})")
        if self.lost:
            out.append(f"{self.lost} acknowledged episodes are missing from the store")
        if self.duplicates_in_logs:
            out.append(f"{self.duplicates_in_logs} episode ids acknowledged more than once")
        if self.trained + self.pending + self.dropped != self.acked:
            out.append(f"acked {self.acked} != trained {self.trained} + pending {self.pending} + dropped "
                       f"{self.dropped} (statuses {self.status_of_acked})")
        for name in ("consumed_twice", "beyond_final_step", "step_count_mismatches", "orphan_consumed_steps",
                     "calls_mismatches"):
            if getattr(self, name):
                out.append(f"{name} = {getattr(self, name)}")
        if self.final_checkpoint_step != self.final_step:
            out.append(f"final checkpoint is at step {self.final_checkpoint_step}, the store at {self.final_step}")
        for i, k in enumerate(self.server_kills):
            if self.final_step <= k.steps_before:
                out.append(f"no training after server restart {i + 1}: final step {self.final_step} <= "
                           f"{k.steps_before} at the kill")
        if self.client_kills != self.planned_client_kills:
            out.append(f"{self.client_kills} client kills happened, {self.planned_client_kills} planned")
        if len(self.server_kills) != self.config.server_kills:
            out.append(f"{len(self.server_kills)} server kills happened, {self.config.server_kills} planned")
        return out

    def table(self) -> str:
        rows: list[tuple[str, object]] = [
            ("acknowledged episodes (union of client logs)", self.acked),
            ("  trained", self.trained),
            ("  pending (still in the store)", self.pending),
            ("  dropped (stale / uniform)", self.dropped),
            ("  other status", self.acked - self.trained - self.pending - self.dropped),
            ("lost (acknowledged, not in the store)", self.lost),
            ("duplicate acknowledgements in the logs", self.duplicates_in_logs),
            ("consumed twice / by a step past the final checkpoint", f"{self.consumed_twice} / {self.beyond_final_step}"),
            ("steps whose episode count disagrees with the store", self.step_count_mismatches),
            ("acked, stored without the client's calls", self.calls_mismatches),
            ("stored but never logged by a client", self.stored_unacked),
            ("train steps (final) / final checkpoint step", f"{self.final_step} / {self.final_checkpoint_step}"),
            ("policy version (final)", self.final_policy_version),
            ("client processes / SIGKILLed / crashed on their own",
             f"{self.client_processes} / {self.client_kills} / {self.client_crashes}"),
            ("episodes released by a replacement's join", self.released_on_rejoin),
            ("client-side failed episodes by phase", dict(sorted(self.client_failures.items())) or "{}"),
        ]
        for i, k in enumerate(self.server_kills, 1):
            rows += [
                (f"server kill {i}: at acked / open episodes", f"{k.at_acked} / {k.open_episodes}"),
                ("  steps at kill -> checkpoint resumed -> final", f"{k.steps_before} -> {k.checkpoint_step} -> "
                                                                  f"{self.final_step}"),
                ("  episodes rewound to pending", k.rewound_episodes),
                ("  lost in flight / acked across / acked as duplicate",
                 f"{k.lost_in_flight} / {k.acked_across} / {k.acked_as_duplicate}"),
                ("  downtime (kill -> ready)", f"{k.downtime_s:.1f} s"),
            ]
        rows.append(("wall time", f"{self.wall_s:.1f} s"))
        width = max(len(r[0]) for r in rows)
        return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d.update(trained=self.trained, pending=self.pending, dropped=self.dropped, problems=self.problems())
        return d


# ---------------------------------------------------------------------- processes
class ServerProc:
    def __init__(self, cfg: ChaosConfig, port: int, data_dir: Path, log_dir: Path) -> None:
        self.cfg, self.port, self.data_dir, self.log_dir = cfg, port, data_dir, log_dir
        self.proc: Child | None = None
        self.starts = 0
        self.url = f"http://127.0.0.1:{port}"

    def start(self, resume: bool) -> float:
        c = self.cfg
        cmd = [sys.executable, "-m", "agentjet.cli", "server", "--model", c.model, "--engine", c.engine,
               "--port", str(self.port), "--data-dir", str(self.data_dir), "--group-size", str(c.group_size),
               "--batch-groups", str(c.batch_groups), "--checkpoint-every", str(c.checkpoint_every),
               "--lease-seconds", str(c.lease_seconds), "--lr", str(c.lr), "--max-staleness", str(c.max_staleness),
               "--max-tokens", "16", "--log-level", "INFO"] + (["--resume"] if resume else [])
        log_path = self.log_dir / f"server-{self.starts}.log"
        self.starts += 1
        t0 = time.monotonic()
        env = {**os.environ, "OMP_NUM_THREADS": str(self.cfg.server_threads), "TOKENIZERS_PARALLELISM": "false"}
        self.proc = Child.spawn(cmd, log_path, env=env, append=False, parent_death_signal=signal.SIGKILL)
        deadline = t0 + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                health = httpx.get(f"{self.url}/health", timeout=2).json()
                if health["status"] == "ready" and health.get("pid") == self.proc.pid:  # ours, not a port thief
                    return time.monotonic() - t0
            time.sleep(0.1)
        raise RuntimeError(f"the server did not become ready:\n{self.log_tail()}")

    def status(self) -> dict | None:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = httpx.get(f"{self.url}/swarm/v1/status", timeout=5)
            if r.status_code == 200:
                return r.json()
        return None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()

    def terminate(self, timeout: float = 120.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` s (``agentjet.runtime.proc``). The exit code; None when it was killed."""
        if self.proc is None or not self.proc.alive():
            return self.proc.returncode if self.proc else None
        self.proc.signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.proc.kill()
        return code

    def log_tail(self, n: int = 40) -> str:
        return self.proc.tail(n) if self.proc is not None else ""


@dataclass
class ClientSlot:
    slot: int
    generation: int = 0
    proc: Child | None = None


class Clients:
    def __init__(self, cfg: ChaosConfig, url: str, log_dir: Path, rng: random.Random) -> None:
        self.cfg, self.url, self.log_dir, self.rng = cfg, url, log_dir, rng
        self.stop_file = log_dir / "STOP"
        self.slots = [ClientSlot(i) for i in range(cfg.clients)]
        self.started = 0
        self.crashes = 0

    def start(self, s: ClientSlot) -> None:
        tag = f"{s.slot}-{s.generation}"
        cmd = [sys.executable, str(CLIENT_SCRIPT), "--url", self.url, "--client-id", f"chaos-{s.slot}",
               "--acked", str(self.log_dir / f"acked-{tag}.log"), "--events", str(self.log_dir / f"events-{tag}.jsonl"),
               "--stop", str(self.stop_file), "--workers", str(self.cfg.workers), "--tasks", str(self.cfg.tasks),
               "--retries", str(self.cfg.client_retries), "--seed", str(self.rng.randrange(2**31))]
        s.proc = Child.spawn(cmd, self.log_dir / f"client-{tag}.err", append=False, parent_death_signal=signal.SIGKILL)
        self.started += 1

    def start_all(self) -> None:
        for s in self.slots:
            self.start(s)

    def kill_random(self) -> int:
        live = [s for s in self.slots if s.proc is not None and s.proc.poll() is None]
        s = self.rng.choice(live)
        s.proc.kill()  # type: ignore[union-attr]
        s.generation += 1
        self.start(s)
        return s.slot

    def restart_exited(self) -> None:
        """A client that died on its own (not by our hand) is counted and replaced."""
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is not None and not self.stop_file.exists():
                self.crashes += 1
                s.generation += 1
                self.start(s)

    def stop(self, timeout: float = 60.0) -> None:
        self.stop_file.touch()
        deadline = time.monotonic() + timeout
        for s in self.slots:
            if s.proc is None:
                continue
            if s.proc.wait(max(0.1, deadline - time.monotonic())) is None:
                s.proc.kill()

    def kill_all(self) -> None:
        for s in self.slots:
            if s.proc is not None and s.proc.alive():
                s.proc.kill()


# ---------------------------------------------------------------------- reading the evidence
def read_acked(log_dir: Path) -> list[str]:
    """Every acknowledged id in every client log (a line cut short by a SIGKILL has no newline: skipped)."""
    ids: list[str] = []
    for f in sorted(log_dir.glob("acked-*.log")):
        data = f.read_text(encoding="utf-8", errors="replace")
        lines = data.split("\n")
        ids.extend(line for line in lines[:-1] if line)  # the last piece is "" or a cut-short line
    return ids


def count_acked(log_dir: Path) -> int:
    return sum(f.read_bytes().count(b"\n") for f in log_dir.glob("acked-*.log"))


def read_events(log_dir: Path) -> list[dict]:
    out = []
    for f in sorted(log_dir.glob("events-*.jsonl")):
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def read_store(data_dir: Path) -> tuple[dict[str, tuple[str, int | None, int, int]], dict[int, dict]]:
    """episode id -> (status, consumed_step, n_calls, n_samples); step -> metrics. Only while no server runs."""
    db = sqlite3.connect(str(data_dir / "store.sqlite"))
    try:
        eps = {r[0]: tuple(r[1:]) for r in db.execute(
            "SELECT episode_id, status, consumed_step, n_calls, n_samples FROM episodes")}
        steps = {r[0]: json.loads(r[1]) for r in db.execute("SELECT step, metrics FROM steps")}
    finally:
        db.close()
    return eps, steps


def checkpoint_state(data_dir: Path) -> dict:
    """The trainer state of the checkpoint a --resume would load ({}: none)."""
    ck = data_dir / "checkpoints"
    pointer = ck / "latest"
    if not pointer.exists():
        return {}
    state = ck / pointer.read_text().strip() / "trainer_state.json"
    return json.loads(state.read_text()) if state.exists() else {}


def checkpoint_step(data_dir: Path) -> int:
    """The train step of the checkpoint a --resume would load (-1: none)."""
    return int(checkpoint_state(data_dir).get("train_steps", -1))


# ---------------------------------------------------------------------- the run
def _free_port() -> int:
    from agentjet.runtime.launch import free_port

    return free_port()


def run_chaos(cfg: ChaosConfig, workdir: Path, say=print) -> ChaosReport:  # noqa: ANN001
    from agentjet.models import resolve_model

    resolve_model(cfg.model)  # build / check the model once, before any process needs it
    workdir.mkdir(parents=True, exist_ok=True)
    data_dir, log_dir = workdir / "data", workdir / "logs"
    log_dir.mkdir(exist_ok=True)
    rng = random.Random(cfg.seed)
    report = ChaosReport(config=cfg, workdir=str(workdir))
    n_client_kills = math.ceil(cfg.kill_fraction * cfg.clients - 1e-9) if cfg.kill_fraction > 0 else 0
    report.planned_client_kills = n_client_kills
    client_kill_at = sorted(int(cfg.episodes * rng.uniform(0.05, 0.9)) for _ in range(n_client_kills))
    server_kill_at = [int(cfg.episodes * (i + 1) / (cfg.server_kills + 1) * rng.uniform(0.85, 1.15))
                      for i in range(cfg.server_kills)]
    server = ServerProc(cfg, _free_port(), data_dir, log_dir)
    clients = Clients(cfg, server.url, log_dir, rng)
    t_start = time.monotonic()
    try:
        say(f"chaos: starting the server on {server.url} (data in {data_dir})")
        server.start(resume=False)
        clients.start_all()
        deadline = t_start + cfg.timeout_s
        last_report = 0.0
        while (acked := count_acked(log_dir)) < cfg.episodes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {acked}/{cfg.episodes} episodes acknowledged after {cfg.timeout_s:.0f} s\n"
                                   f"{server.log_tail()}")
            if server.proc is not None and server.proc.poll() is not None:
                raise RuntimeError(f"the server died on its own (exit {server.proc.returncode}):\n{server.log_tail()}")
            clients.restart_exited()
            if client_kill_at and acked >= client_kill_at[0]:
                client_kill_at.pop(0)
                time.sleep(rng.uniform(0, 0.5))  # land somewhere inside an episode
                slot = clients.kill_random()
                report.client_kills += 1
                say(f"chaos: SIGKILLed client {slot} at {acked} acked; replacement started")
            if server_kill_at and acked >= server_kill_at[0]:
                server_kill_at.pop(0)
                report.server_kills.append(_kill_and_restart_server(cfg, server, data_dir, acked, say))
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                st = server.status() or {}
                buf = st.get("buffer") or {}
                say(f"chaos: {acked}/{cfg.episodes} acked, step {st.get('train_steps')}, open "
                    f"{buf.get('open_episodes')}, pending {buf.get('pending_episodes')}, trained "
                    f"{buf.get('trained_episodes')}")
            time.sleep(0.2)
        say(f"chaos: {acked} acked: stopping clients, then the server (SIGTERM: it checkpoints on stop)")
        clients.stop()
        report.server_exit_code = server.terminate()
    finally:
        clients.kill_all()
        if server.proc is not None and server.proc.alive():
            server.proc.kill()
    report.wall_s = time.monotonic() - t_start
    report.client_processes = clients.started
    report.client_crashes = clients.crashes
    _audit(report, data_dir, log_dir)
    return report


def _kill_and_restart_server(cfg: ChaosConfig, server: ServerProc, data_dir: Path, acked: int, say) -> ServerKill:  # noqa: ANN001
    kill = ServerKill(at_acked=acked)
    # prefer the moment right after a train step that no checkpoint covers: resume must then rewind
    deadline = time.monotonic() + cfg.uncheckpointed_wait_s
    st = server.status() or {}
    while time.monotonic() < deadline and cfg.checkpoint_every > 1:
        steps = int(st.get("train_steps", 0))
        if steps % cfg.checkpoint_every != 0:
            break
        time.sleep(0.1)
        st = server.status() or st
    kill.open_episodes = int((st.get("buffer") or {}).get("open_episodes", -1))
    kill.t_kill = time.time()
    t0 = time.monotonic()
    server.kill()
    eps, steps = read_store(data_dir)
    kill.steps_before = max(steps, default=0)
    kill.checkpoint_step = max(checkpoint_step(data_dir), 0)
    kill.rewound_episodes = sum(1 for e in eps.values() if e[1] is not None and e[1] > kill.checkpoint_step)
    say(f"chaos: SIGKILLed the server at {acked} acked, step {kill.steps_before} (checkpoint at step "
        f"{kill.checkpoint_step}, {kill.rewound_episodes} episodes to rewind, {kill.open_episodes} open); "
        "restarting with --resume")
    server.start(resume=True)
    kill.downtime_s = time.monotonic() - t0
    st = server.status() or {}
    kill.steps_after_restart = int(st.get("train_steps", -1))
    say(f"chaos: server back after {kill.downtime_s:.1f} s, resumed from the step-{kill.checkpoint_step} "
        f"checkpoint (now at step {kill.steps_after_restart})")
    return kill


def _audit(report: ChaosReport, data_dir: Path, log_dir: Path) -> None:
    ids = read_acked(log_dir)
    report.acked_lines = len(ids)
    counts = Counter(ids)
    report.duplicates_in_logs = sum(1 for n in counts.values() if n > 1)
    acked = set(counts)
    report.acked = len(acked)
    eps, steps = read_store(data_dir)
    report.stored = len(eps)
    report.lost = len(acked - set(eps))
    report.stored_unacked = len(set(eps) - acked)
    report.status_of_acked = dict(Counter(eps[e][0] for e in acked if e in eps))
    report.final_step = max(steps, default=0)
    report.final_checkpoint_step = checkpoint_step(data_dir)
    report.final_policy_version = int(checkpoint_state(data_dir).get("policy_version", -1))
    # exactly once against the surviving lineage: each step consumed exactly the episodes pointing at it,
    # and no episode points past the final checkpoint (the weights that survived)
    per_step = Counter(e[1] for e in eps.values() if e[0] == "trained" and e[1] is not None)
    report.step_count_mismatches = sum(1 for s, m in steps.items() if int(m.get("episodes", -1)) != per_step.get(s, 0))
    report.orphan_consumed_steps = sum(n for s, n in per_step.items() if s not in steps)
    report.beyond_final_step = sum(1 for e in eps.values() if e[1] is not None and e[1] > report.final_checkpoint_step)
    db = sqlite3.connect(str(data_dir / "store.sqlite"))
    try:  # episode_id is UNIQUE, so this is 0 unless the schema changes; counted, not assumed
        report.consumed_twice = db.execute(
            "SELECT COUNT(*) FROM (SELECT episode_id FROM episodes GROUP BY episode_id HAVING COUNT(*) > 1)"
        ).fetchone()[0]
    finally:
        db.close()
    # the client side: failures, and what happened to the episodes open at each server kill
    events = read_events(log_dir)
    report.client_failures = dict(Counter(e.get("phase", "?") for e in events if e.get("ev") == "fail"))
    client_calls = {e["eid"]: e.get("calls") for e in events if e.get("ev") == "ack"}
    report.calls_mismatches = sum(1 for eid in acked & set(eps) if eps[eid][3] == 0
                                  or client_calls.get(eid, eps[eid][2]) != eps[eid][2])
    report.released_on_rejoin = sum(int(e.get("released", 0)) for e in events if e.get("ev") == "join")
    for e in events:  # each outcome goes to the last server kill before it, if the episode began before that
        before = [k for k in report.server_kills if k.t_kill <= e["t"]]
        if e.get("eid") is None or not before or e.get("began", 0) >= before[-1].t_kill:
            continue
        k = before[-1]
        if e.get("ev") == "fail":
            k.lost_in_flight += 1
        elif e.get("ev") == "ack":
            k.acked_across += 1
            k.acked_as_duplicate += bool(e.get("dup"))


def config_from_env(**overrides: object) -> ChaosConfig:
    """``AGENTJET_CHAOS_EPISODES`` / ``_CLIENTS`` / ``_KILL_FRACTION`` / ``_SERVER_KILLS`` / ``_SEED`` size the run."""
    env = os.environ.get
    cfg = ChaosConfig(
        episodes=int(env("AGENTJET_CHAOS_EPISODES", 200)), clients=int(env("AGENTJET_CHAOS_CLIENTS", 6)),
        kill_fraction=float(env("AGENTJET_CHAOS_KILL_FRACTION", 0.3)),
        server_kills=int(env("AGENTJET_CHAOS_SERVER_KILLS", 1)), seed=int(env("AGENTJET_CHAOS_SEED", 0)))
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg
