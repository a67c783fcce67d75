"""Runs a study: starts runs (each an `ajet up` spec on free ports, in a directory of its own), watches
them through their server's status API, stops the ones clearly behind, retries a crashed one, and keeps
the study on disk after every change so that a restarted ``ajet research`` continues where it was.

On restart: a run whose `ajet up` is still alive is re-attached to; one whose client finished meanwhile is
collected; any other running run is restarted (a new attempt). Final runs are never started again.
Ctrl-C stops the running runs (they restart on the next start); SIGKILL leaves them running (they are
re-attached to).
"""

from __future__ import annotations

import json
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import ValidationError

from agentjet.apps.research.display import Display, RunView
from agentjet.apps.research.monitor import (
    Health,
    Limits,
    TrialResult,
    Watch,
    eval_points,
    judge,
    parse_status,
    read_result,
    result_points,
)
from agentjet.apps.research.planner import OptunaPlanner, Planner
from agentjet.apps.research.process import TrialProcess
from agentjet.apps.research.spec import StudySpec, StudySpecError, split_params
from agentjet.apps.research.state import Attempt, StudyState, StudyStore, TrialRecord, TrialState
from agentjet.apps.up import ClientSpec
from agentjet.protocol import SWARM_PREFIX, ServerStatus
from agentjet.runtime.clock import Clock, SystemClock
from agentjet.runtime.launch import free_port


class StudyAborted(RuntimeError):
    """The study cannot go on (every run fails before its server starts, say); the message says why."""


def trial_swarm(spec: StudySpec, run: TrialRecord, attempt_dir: Path, ports: dict[str, int]) -> dict[str, Any]:
    """The `ajet up` spec of one attempt: the base spec on fresh ports and data dirs, the run's server
    settings on the primary server, and the built-in trial client unless the base names clients."""
    server_params, client_params = split_params(run.params)
    servers = {}
    for name, raw in spec.base.servers.items():
        options = {**spec.base.options(name), **(server_params if name == spec.primary else {})}
        servers[name] = {**raw, "port": ports[name], "data_dir": str(attempt_dir / f"server-{name}"),
                         "options": options, "admin_token": raw.get("admin_token") or secrets.token_urlsafe(32)}
    admin = {"AGENTJET_ADMIN_TOKEN": str(servers[spec.primary]["admin_token"])}  # the client pauses for evals
    url = f"http://{spec.base.host(spec.primary)}:{ports[spec.primary]}"
    if spec.base.clients:
        marks = {"{server_url}": url, "{trial_dir}": str(attempt_dir), "{seed}": str(run.seed),
                 **{f"{{url:{n}}}": f"http://{spec.base.host(n)}:{ports[n]}" for n in servers}}
        env = {"AJET_SERVER_URL": url, "AJET_TRIAL_DIR": str(attempt_dir), "AJET_TRIAL_SEED": str(run.seed),
               "AJET_TRIAL_PARAMS": json.dumps(client_params), **admin}
        clients = {n: ClientSpec(command=[_fill(part, marks) for part in c.command],
                                 env={**{k: _fill(v, marks) for k, v in c.env.items()}, **env})
                   for n, c in spec.base.clients.items()}
    else:
        clients = {"trial": ClientSpec(command=[sys.executable, "-m", "agentjet.apps.research.trial_client", "--server",
                                                url, "--settings", str(attempt_dir / "client.json"), "--seed",
                                                str(run.seed), "--out", str(attempt_dir)], env=admin)}
    return {"servers": servers, "clients": {n: c.model_dump(mode="json") for n, c in clients.items()},
            "log_dir": str(attempt_dir / "logs")}


def _fill(text: str, marks: dict[str, str]) -> str:
    for key, value in marks.items():
        text = text.replace(key, value)
    return text


@dataclass
class ActiveRun:
    run: TrialRecord
    proc: TrialProcess
    watch: Watch
    url: str
    dir: Path
    train_steps: int = 0


class StudyRunner:
    def __init__(self, spec: StudySpec, root: Path, planner: Planner, optuna: OptunaPlanner,
                 display: Display | None = None, clock: Clock | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.spec = spec
        self.store = StudyStore(root)
        self.planner = planner
        self.optuna = optuna
        self.display = display or Display(None, spec)
        self.clock = clock or SystemClock()
        self.sleep = sleep
        self.active: dict[str, ActiveRun] = {}
        self.exhausted = False
        self._http = httpx.Client(timeout=5.0)
        h = spec.health
        self.limits = Limits(h.start_timeout_s, h.stall_s, spec.run_timeout_s())
        self.state = self._open()
        self._elapsed_before = self.state.elapsed_s
        self._session_start = self.clock.monotonic()

    # ------------------------------------------------------------------ study lifecycle
    def _open(self) -> StudyState:
        self.store.acquire()
        try:
            if self.store.exists():
                state = self.store.load()
                if state.digest != self.spec.digest():
                    raise StudySpecError(f"{self.store.root} holds a different study (its question, metric, base, "
                                         "client, space or seeds differ); give another output directory")
            else:
                state = StudyState(digest=self.spec.digest(), created_at=time.time())
            state.sessions += 1
            state.finished = False
            self.store.save_spec(self.spec)
            self.store.save(state)
        except BaseException:
            self.store.release()
            raise
        return state

    def elapsed(self) -> float:
        return self._elapsed_before + (self.clock.monotonic() - self._session_start)

    def _save(self) -> None:
        self.state.elapsed_s = self.elapsed()
        self.store.save(self.state)

    def note(self, text: str) -> None:
        self.state.notes.append(text)
        self.display.event(text)

    def run(self) -> StudyState:
        self.optuna.restore(self.state)
        with self.display:
            try:
                self._recover()
                while True:
                    for active in list(self.active.values()):
                        self._poll(active)
                    self._fill()
                    self._save()
                    self.display.update(self.state, self._views(), self.elapsed())
                    if not self.active:
                        break
                    self.sleep(self.spec.health.poll_s)
                self.state.finished = not self.state.by_state(TrialState.PLANNED, TrialState.RUNNING)
            except KeyboardInterrupt:
                self.note("interrupted: stopping the running runs (they restart on the next start)")
                for active in list(self.active.values()):
                    self._stop(active, "interrupted")
                raise
            except StudyAborted as exc:
                self.note(f"study aborted: {str(exc).splitlines()[0]}")
                for active in list(self.active.values()):
                    self._stop(active, "study aborted")
                raise
            finally:
                self._save()
                self.store.write_results(self.state, self.spec)
                self._http.close()
                self.store.release()
        return self.state

    # ------------------------------------------------------------------ budget and planning
    def _time_left(self) -> bool:
        minutes = self.spec.budget.minutes
        return minutes is None or self.elapsed() < minutes * 60

    def _room_for_config(self) -> bool:
        trials = self.spec.budget.trials
        return trials is None or len(self.state.trials) + self.spec.seeds <= trials

    def _fill(self) -> None:
        while len(self.active) < self.spec.parallel and self._time_left():
            run = next((t for t in self.state.trials if t.state is TrialState.PLANNED), None)
            if run is None:
                if self.exhausted or not self._room_for_config():
                    return
                proposal = self.planner.propose(self.state)
                if proposal is None:
                    self.exhausted = True
                    self.note("the planner has no new configuration to try (the space is exhausted)")
                    return
                config = self.state.add_config(proposal.params, proposal.source, proposal.why, self.spec.seeds)
                self.note(f"{config.id} ({proposal.source}): {proposal.params} - {proposal.why}")
                run = next(t for t in self.state.trials if t.config_id == config.id)
            self._start(run)

    # ------------------------------------------------------------------ starting and stopping runs
    def _start(self, run: TrialRecord) -> None:
        number = len(run.attempts) + 1
        adir = self.store.attempt_dir(run, number)
        adir.mkdir(parents=True, exist_ok=True)
        ports = {name: free_port(self.spec.base.host(name)) for name in self.spec.base.servers}
        swarm = trial_swarm(self.spec, run, adir, ports)
        trial_file = adir / "trial.yaml"
        trial_file.touch(mode=0o600)  # it holds the trial servers' admin tokens
        trial_file.write_text(yaml.safe_dump(swarm, sort_keys=False))
        if not self.spec.base.clients:
            _, client_params = split_params(run.params)
            settings = self.spec.client.model_copy(update=client_params)
            (adir / "client.json").write_text(settings.model_dump_json(indent=1))
        proc = TrialProcess.launch(adir / "trial.yaml", adir / "up.log")
        run.attempts.append(Attempt(number=number, started_at=time.time(), port=ports[self.spec.primary],
                                    pid=proc.pid, create_time=proc.create_time))
        run.points = []
        run.move(TrialState.RUNNING)
        self.optuna.begin(run)
        self.active[run.id] = ActiveRun(run, proc, Watch(started=self.clock.monotonic()),
                                        f"http://{self.spec.base.host(self.spec.primary)}:{ports[self.spec.primary]}",
                                        adir)
        self._save()
        self.display.event(f"{run.id} started (attempt {number}, seed {run.seed}): {run.params}")

    def _stop(self, active: ActiveRun, outcome: str) -> None:
        active.proc.stop(self.spec.health.stop_grace_s)
        attempt = active.run.attempt
        if attempt is not None:
            attempt.ended_at = time.time()
            attempt.outcome = outcome
            attempt.children = list(active.proc.children)
            active.run.seconds += attempt.ended_at - attempt.started_at
        self.active.pop(active.run.id, None)
        if not self.spec.health.keep_checkpoints:
            for ckpt in active.dir.glob("server-*/checkpoints"):
                shutil.rmtree(ckpt, ignore_errors=True)

    # ------------------------------------------------------------------ watching
    def _status(self, url: str) -> ServerStatus | None:
        try:
            r = self._http.get(f"{url}{SWARM_PREFIX}/status")
            return parse_status(r.json()) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, ValidationError):
            return None

    def _poll(self, a: ActiveRun) -> None:
        status = self._status(a.url)
        a.watch.observe(status, self.clock.monotonic())
        attempt = a.run.attempt
        assert attempt is not None
        if a.proc.refresh_children():
            attempt.children = list(a.proc.children)
        if status is not None:
            attempt.ready = True
            a.train_steps = status.train_steps
            for step, value in sorted(eval_points(status, self.spec.metric.source).items()):
                if a.run.add_point(step, value) and self.optuna.report(a.run, step, value):
                    self._prune(a, step, value)
                    return
        result = read_result(a.dir)
        health = judge(a.watch, a.proc.alive(), result, self.clock.monotonic(), self.limits)
        if health is Health.FINISHED:
            assert result is not None
            self._finish(a, result)
        elif health is Health.NAN_LOSS:
            self._fail(a, f"the loss became NaN at step {a.train_steps}")
        elif health is Health.TIMED_OUT:
            self._fail(a, f"ran past its limit of {self.limits.run_timeout_s:.0f}s")
        elif health.retryable:
            detail = f" ({result.stop_reason})" if result is not None else ""
            self._crash(a, f"{health.value}{detail}")

    def _prune(self, a: ActiveRun, step: int, value: float) -> None:
        best = self.optuna.best_other(a.run, step)
        self._stop(a, "pruned")
        behind = f", best run at that point {best:.3f}" if best is not None else ""
        a.run.move(TrialState.PRUNED, f"stopped at step {step}: {value:.3f}{behind} (clearly behind)")
        self.optuna.finish(a.run)
        self.display.event(f"{a.run.id} pruned: {a.run.reason}")
        for sibling in self.state.siblings(a.run):
            if sibling.state is TrialState.PLANNED:
                sibling.move(TrialState.PRUNED, f"not run: seed {a.run.seed} of this configuration was pruned at "
                                                f"step {step}")
        self._save()

    def _finish(self, a: ActiveRun, result: TrialResult) -> None:
        self._stop(a, "finished")
        for step, value in sorted(result_points(result, self.spec.metric.source).items()):
            if a.run.add_point(step, value):
                self.optuna.report(a.run, step, value)
        final = a.run.value(self.spec.metric)
        if final is None:
            a.run.move(TrialState.FAILED, "finished without an eval point after training")
        else:
            a.run.move(TrialState.DONE, f"{result.stop_reason}; {self.spec.metric.source} {final:.3f}")
        self.optuna.finish(a.run)
        self.display.event(f"{a.run.id} {a.run.state.value}: {a.run.reason}")
        self._save()

    def _fail(self, a: ActiveRun, reason: str) -> None:
        self._stop(a, reason)
        a.run.move(TrialState.FAILED, reason)
        self.optuna.finish(a.run)
        self.display.event(f"{a.run.id} failed: {reason}")
        self._save()

    def _crash(self, a: ActiveRun, what: str) -> None:
        self._stop(a, what)
        run = a.run
        run.crashes += 1
        self.optuna.abandon(run)
        if run.crashes <= self.spec.health.retries:
            self.note(f"{run.id} {what}; restarting it (retry {run.crashes} of {self.spec.health.retries}); "
                      f"log: {a.dir}")
            self._start(run)
            return
        run.move(TrialState.FAILED, f"{what} on {run.crashes} attempts; log: {a.dir}")
        self.display.event(f"{run.id} failed: {run.reason}")
        self._save()
        never_started = not any(att.ready for t in self.state.trials for att in t.attempts)
        if never_started:
            raise StudyAborted(f"run {run.id} failed {run.crashes} times and no run's server has ever started; "
                               f"the last log:\n{_log_tail(a.dir)}")

    # ------------------------------------------------------------------ restart
    def _recover(self) -> None:
        for run in self.state.by_state(TrialState.RUNNING):
            attempt = run.attempt
            assert attempt is not None
            adir = self.store.attempt_dir(run, attempt.number)
            proc = TrialProcess.attach(attempt.pid or 0, attempt.create_time or 0.0, attempt.children)
            result = read_result(adir)
            ago = max(0.0, time.time() - attempt.started_at)
            host = self.spec.base.host(self.spec.primary)
            active = ActiveRun(run, proc, Watch(started=self.clock.monotonic() - ago), f"http://{host}:{attempt.port}", adir)
            if result is not None and result.ok:
                self.optuna.begin(run)
                self.display.event(f"{run.id} finished while the study was stopped; collecting it")
                self._finish(active, result)
            elif proc.alive():
                self.optuna.begin(run)
                self.active[run.id] = active
                self.display.event(f"{run.id} is still running (pid {proc.pid}): re-attached")
            else:
                self._stop(active, "interrupted")
                self.display.event(f"{run.id} was interrupted: restarting it")
                self._start(run)
        self._save()

    # ------------------------------------------------------------------ display
    def _views(self) -> list[RunView]:
        return [RunView(run=a.run, train_steps=a.train_steps, seconds=self.clock.monotonic() - a.watch.started)
                for a in self.active.values()]


def _log_tail(attempt_dir: Path, chars: int = 1500) -> str:
    parts = []
    for path in [attempt_dir / "up.log", *sorted((attempt_dir / "logs").glob("*.log"))]:
        if path.exists():
            parts.append(f"--- {path}\n{path.read_text(errors='replace')[-chars:]}")
    return "\n".join(parts) or "(no log)"
