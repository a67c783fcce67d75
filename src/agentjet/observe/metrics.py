"""Metrics of one server instance: Prometheus (its own CollectorRegistry), the JSONL file in the data dir
(always), optional TensorBoard / W&B sinks, and the per-token trainer log the trace viewer reads.

Nothing here is module-level state: a ``MetricsHub`` belongs to one server, so several servers in one process
(tests, ``ajet up``) never share counters.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agentjet.observe.events import StepRecord
from agentjet.observe.schema import RunSnapshot
from agentjet.observe.trainlog import TrainLog
from agentjet.runtime.clock import Clock, SystemClock
from agentjet.settings import LogSink, ObserveSettings

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TRAINLOG_FILE = "observe.sqlite"
TENSORBOARD_DIR = "tensorboard"
# Step metrics also exported as Prometheus gauges (their value at the latest step).
GAUGED = ("loss", "pg_loss", "kl", "grad_norm", "clip_frac", "ratio_max", "mean_abs_logprob_diff", "reward_mean",
          "trained_tokens", "samples", "episodes", "staleness/mean", "staleness/masked_token_share", "merge/ratio",
          "mismatch_kl", "is_masked_frac", "is_weight_mean", "throughput/generated_tokens_per_s",
          "throughput/trained_tokens_per_s")
PHASES = ("waiting", "prepare", "training", "sync")


class MissingExtra(RuntimeError):
    """An optional sink was asked for but its package is not installed."""


class MetricSink(Protocol):
    def write(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """One JSON object per train step: ``{"step", "policy_version", "time", <metric>: value, ...}``. After a
    ``--resume`` the steps after the checkpoint are trained again and appear again: the last line wins."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write_record(self, record: StepRecord) -> None:
        adapter = {} if record.adapter is None else {"adapter": record.adapter}
        line = json.dumps({"step": record.step, "policy_version": record.policy_version, "time": record.time,
                           **adapter, **_finite(record.metrics)}, sort_keys=False)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def write(self, step: int, metrics: dict[str, float]) -> None:
        self.write_record(StepRecord(step=step, policy_version=int(metrics.get("policy_version", 0)),
                                     time=time.time(), metrics=metrics))

    def close(self) -> None:
        with self._lock:
            self._file.close()


class TensorBoardSink:
    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise MissingExtra("log_to tensorboard needs the tensorboard package: pip install 'agentjet[tracking]'"
                               ) from exc
        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in _finite(metrics).items():
            self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    def __init__(self, project: str, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise MissingExtra("log_to wandb needs the wandb package: pip install 'agentjet[tracking]'") from exc
        run_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=project, dir=str(run_dir), config=config, reinit=True)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(_finite(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


def open_sinks(settings: ObserveSettings, data_dir: Path, run_config: dict[str, Any]) -> list[MetricSink]:
    """The optional sinks named by ``settings.log_to`` (MissingExtra when a package is absent)."""
    sinks: list[MetricSink] = []
    for sink in dict.fromkeys(settings.log_to):
        if sink is LogSink.TENSORBOARD:
            sinks.append(TensorBoardSink(data_dir / TENSORBOARD_DIR))
        elif sink is LogSink.WANDB:
            sinks.append(WandbSink(settings.wandb_project, data_dir, run_config))
    return sinks


def check_sinks_available(log_to: list[LogSink]) -> None:
    """Fail early (before a model loads) when a requested sink's package is missing."""
    import importlib.util

    need = {LogSink.TENSORBOARD: "tensorboard", LogSink.WANDB: "wandb"}
    for sink in log_to:
        if importlib.util.find_spec(need[sink]) is None:
            raise MissingExtra(f"log_to {sink.value} needs the {need[sink]} package: pip install 'agentjet[tracking]'")


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}


class SnapshotCollector(Collector):
    """Live counters read at scrape time from the server's snapshot: nothing on the request path."""

    def __init__(self, snapshot: Callable[[], RunSnapshot]) -> None:
        self._snapshot = snapshot

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        gauges = {"policy_version": (s.policy_version, "served policy version (its step committed, its weights "
                                     "held by the generator)"),
                  "learner_version": (s.learner_version, "the learner's policy version (ahead of policy_version "
                                      "while a weight push is in flight)"),
                  "weight_push_in_flight": (int(s.weight_push_in_flight), "1 while a weight push is in flight"),
                  "open_episodes": (s.open_episodes, "episodes begun and not yet ended"),
                  "pending_episodes": (s.pending_episodes, "acknowledged episodes waiting for a train step"),
                  "connected_clients": (s.clients, "clients seen since start"),
                  "paused": (int(s.paused), "1 while training is paused"),
                  "uptime_seconds": (s.uptime_s, "seconds since the server started")}
        for name, (value, doc) in gauges.items():
            yield GaugeMetricFamily(f"agentjet_{name}", doc, value=value)
        counters = {"train_steps": (s.train_steps, "train steps"),
                    "chat_calls": (s.calls, "chat completion calls served"),
                    "generated_tokens": (s.generated_tokens, "tokens generated for chat calls"),
                    "trained_tokens": (s.trained_tokens, "tokens with a loss in train steps"),
                    "train_seconds": (s.train_seconds, "wall seconds in committed train steps (weight pushes apart)"),
                    "weight_sync_seconds": (s.weight_sync_seconds, "wall seconds pushing weights to the generator "
                                            "after committed steps"),
                    "episodes_ended": (s.episodes_ended, "episodes ended and acknowledged"),
                    "trained_episodes": (s.trained_episodes, "episodes consumed by a train step"),
                    "eval_episodes": (s.eval_episodes, "eval episodes stored")}
        if s.weight_syncs is not None:  # engines with a weight-sync seam
            counters["weight_syncs"] = (s.weight_syncs, "weight pushes from the learner to the generator")
            counters["weight_sync_failures"] = (s.weight_sync_failures or 0, "weight pushes that failed after a "
                                                "committed step (the generator served the previous version)")
        for name, (value, doc) in counters.items():
            yield CounterMetricFamily(f"agentjet_{name}", doc, value=value)
        for name, value in sorted(s.generator.items()):
            yield CounterMetricFamily(f"agentjet_generator_{name}", f"the generator's {name.replace('_', ' ')} "
                                      "since start", value=value)
        dropped = CounterMetricFamily("agentjet_dropped_episodes", "episodes never trained on, by reason",
                                      labels=["reason"])
        for reason, n in sorted(s.dropped.items()):
            dropped.add_metric([str(reason)], n)
        yield dropped
        tracking = CounterMetricFamily("agentjet_tracking", "context tracking over the stored episodes",
                                       labels=["what"])
        for what, n in sorted(s.tracking.items()):
            tracking.add_metric([what], n)
        yield tracking
        if s.levels:
            levels = GaugeMetricFamily("agentjet_task_level", "the difficulty level of each task type's latest "
                                       "training episode (as its client noted it)", labels=["task_type"])
            for task_type, level in sorted(s.levels.items()):
                levels.add_metric([task_type], level)
            yield levels
        yield from _adapter_metrics(s)
        yield from _tinker_metrics(s)
        yield from _fleet_metrics(s)


def _adapter_metrics(s: RunSnapshot) -> Iterator[Metric]:
    """Per LoRA adapter (a server with several): its versions, steps and episodes, labelled ``adapter``."""
    if not s.adapters:
        return
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        "policy_version": GaugeMetricFamily("agentjet_adapter_policy_version", "an adapter's served version",
                                            labels=["adapter"]),
        "pending_episodes": GaugeMetricFamily("agentjet_adapter_pending_episodes", "acknowledged episodes an "
                                              "adapter has yet to consume", labels=["adapter"]),
        "train_steps": CounterMetricFamily("agentjet_adapter_train_steps", "an adapter's train steps",
                                           labels=["adapter"]),
        "trained_episodes": CounterMetricFamily("agentjet_adapter_trained_episodes", "episodes an adapter trained "
                                                "on", labels=["adapter"]),
        "trained_tokens": CounterMetricFamily("agentjet_adapter_trained_tokens", "tokens with a loss in an "
                                              "adapter's train steps", labels=["adapter"])}
    for name, adapter in sorted(s.adapters.items()):
        for field, family in families.items():
            family.add_metric([name], getattr(adapter, field))
    yield from families.values()


def _tinker_metrics(s: RunSnapshot) -> Iterator[Metric]:
    """The Tinker API's clients (a server with ``--tinker-key``): sessions, and per training client (labelled
    ``model_id``, its adapter's name) its steps and latest loss."""
    if s.tinker is None:
        return
    t = s.tinker
    yield GaugeMetricFamily("agentjet_tinker_sessions", "open Tinker SDK sessions", value=t.sessions)
    yield GaugeMetricFamily("agentjet_tinker_training_clients", "Tinker training clients (each a LoRA adapter)",
                            value=len(t.training_clients))
    yield GaugeMetricFamily("agentjet_tinker_sampling_clients", "Tinker sampling sessions held",
                            value=t.sampling_clients)
    steps = CounterMetricFamily("agentjet_tinker_optim_steps", "a Tinker training client's optim_step calls",
                                labels=["model_id"])
    fwdbwd = CounterMetricFamily("agentjet_tinker_forward_backward", "a Tinker training client's forward_backward "
                                 "calls", labels=["model_id"])
    loss = GaugeMetricFamily("agentjet_tinker_last_loss", "a Tinker training client's latest forward_backward loss "
                             "(a sum over tokens)", labels=["model_id"])
    for model_id, c in sorted(t.training_clients.items()):
        steps.add_metric([model_id], c.steps)
        fwdbwd.add_metric([model_id], c.forward_backward_calls)
        if c.last_loss is not None:
            loss.add_metric([model_id], c.last_loss)
    yield from (steps, fwdbwd, loss)


_ROUTER = {"routed_calls": "calls routed to a replica (each attempt of a call that moved once)",
           "affinity_hits": "calls of a session sent to the replica of its earlier calls",
           "new_sessions": "new sessions (and calls of none) sent to the least-loaded replica",
           "rebound_sessions": "sessions moved to another replica because theirs left rotation",
           "failovers": "calls that went on on another replica after theirs died or hung",
           "failover_tokens": "tokens generated before a failover and kept",
           "unavailable": "calls that found no replica in rotation in time"}
_REPLICA_GAUGES = {"policy_version": "the policy version a replica holds", "in_flight": "calls a replica generates "
                   "now", "sessions": "sessions routed to a replica", "last_push_s": "seconds of a replica's latest "
                   "weight push"}
_REPLICA_COUNTERS = {"calls": "calls a replica completed", "tokens": "tokens of the calls a replica completed",
                     "failed_calls": "calls a replica did not complete (each went on elsewhere)",
                     "restarts": "restarts of a replica", "pushes": "weight pushes a replica took",
                     "push_failures": "weight pushes that failed on a replica (each took it out of rotation)",
                     "push_s_total": "seconds of a replica's weight pushes"}


def _fleet_metrics(s: RunSnapshot) -> Iterator[Metric]:
    """The generator replicas behind the router (a fleet): the router's counts, and per replica (labelled
    ``replica``) its state, version, load, calls, restarts and timed pushes."""
    if s.fleet is None:
        return
    f = s.fleet
    yield GaugeMetricFamily("agentjet_fleet_replicas_serving", "generator replicas in rotation", value=f.serving)
    for name, doc in _ROUTER.items():
        yield CounterMetricFamily(f"agentjet_router_{name}", doc, value=getattr(f, name))
    state = GaugeMetricFamily("agentjet_replica_state", "1 for a replica's current state", labels=["replica", "state"])
    gauges = {k: GaugeMetricFamily(f"agentjet_replica_{k}", doc, labels=["replica"]) for k, doc in
              _REPLICA_GAUGES.items()}
    counters = {k: CounterMetricFamily(f"agentjet_replica_{k}", doc, labels=["replica"]) for k, doc in
                _REPLICA_COUNTERS.items()}
    for r in f.replicas:
        state.add_metric([r.name, r.state], 1)
        for k, gauge in gauges.items():
            gauge.add_metric([r.name], getattr(r, k))
        for k, counter in counters.items():
            counter.add_metric([r.name], getattr(r, k))
    yield state
    yield from gauges.values()
    yield from counters.values()


class MetricsHub:
    """One per server instance: the Prometheus registry, the metric files and sinks, and the trainer's per-token
    log. Implements the trainer's ``StepObserver`` hook."""

    def __init__(self, settings: ObserveSettings, data_dir: Path, snapshot: Callable[[], RunSnapshot],
                 run_config: dict[str, Any] | None = None, clock: Clock | None = None,
                 trainlog: TrainLog | None = None) -> None:
        """``trainlog``: the per-token train log to record into (and close); default: one in ``data_dir``."""
        self.settings = settings
        self._snapshot = snapshot
        self._clock = clock or SystemClock()
        self.registry = CollectorRegistry()
        self.registry.register(SnapshotCollector(snapshot))
        self._phase = Histogram("agentjet_train_step_phase_seconds", "time of each phase of a train step",
                                ["phase"], registry=self.registry,
                                buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600))
        self._staleness = Histogram("agentjet_trained_episode_staleness_versions", "policy versions between an "
                                    "episode's oldest token and the step that trained it", registry=self.registry,
                                    buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16, 32))
        self._last = Gauge("agentjet_step_metric", "value at the latest train step", ["name"], registry=self.registry)
        self._adapter_last = Gauge("agentjet_adapter_step_metric", "value at an adapter's latest train step (a "
                                   "server with several LoRA adapters)", ["adapter", "name"], registry=self.registry)
        self._reward = Gauge("agentjet_step_reward", "mean reward at the latest train step, per task type",
                             ["task_type"], registry=self.registry)
        self.jsonl = JsonlSink(data_dir / METRICS_FILE)
        self.sinks: list[MetricSink] = open_sinks(settings, data_dir, run_config or {})
        self.trainlog = trainlog or TrainLog(data_dir / TRAINLOG_FILE)
        self._prev_at = self._clock.monotonic()
        self._prev: RunSnapshot | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ StepObserver
    def step_context(self, metrics: dict[str, float]) -> dict[str, float]:
        """Rates since the previous step, drops by reason and merging since start, for the step being stored."""
        now, snap = self._clock.monotonic(), self._snapshot()
        dt = max(now - self._prev_at, 1e-9)
        prev = self._prev
        gen_before = prev.generated_tokens if prev else 0
        out: dict[str, float] = {
            "throughput/generated_tokens_per_s": (snap.generated_tokens - gen_before) / dt,
            "throughput/trained_tokens_per_s": metrics.get("trained_tokens", 0.0) / dt,
            "episodes/open": float(snap.open_episodes),
            "episodes/pending": float(snap.pending_episodes),
            "clients": float(snap.clients),
        }
        out.update({f"dropped/{reason}": float(n) for reason, n in snap.dropped.items()})
        t, t0 = snap.tracking, prev.tracking if prev else {}
        calls = t.get("calls", 0) - t0.get("calls", 0)
        merged_tokens = t.get("tokens_merged", 0) - t0.get("tokens_merged", 0)
        if calls:
            out["merge/ratio"] = (t.get("merged_calls", 0) - t0.get("merged_calls", 0)) / calls
        if merged_tokens:
            out["merge/token_ratio"] = (t.get("tokens_unmerged", 0) - t0.get("tokens_unmerged", 0)) / merged_tokens
        out["drift/repaired"] = float(t.get("drift_repaired", 0) - t0.get("drift_repaired", 0))
        out["drift/repaired_total"] = float(t.get("drift_repaired", 0))
        self._prev_at, self._prev = now, snap
        return out

    def on_step(self, record: StepRecord) -> None:
        with self._lock:
            if record.samples:
                self.trainlog.record(record.step, record.policy_version, record.samples)
            self.jsonl.write_record(record)
            named = record.metrics if record.adapter is None else {f"{record.adapter}/{k}": v
                                                                    for k, v in record.metrics.items()}
            for sink in self.sinks:
                try:
                    sink.write(record.step, named)
                except Exception:  # a sink must never stop training
                    log.exception("metric sink %s failed", type(sink).__name__)
            for phase in PHASES:
                if f"time/{phase}_s" in record.metrics:
                    self._phase.labels(phase).observe(record.metrics[f"time/{phase}_s"])
            for s in record.staleness:
                self._staleness.observe(s)
            for name in GAUGED:
                if name in record.metrics:
                    if record.adapter is None:
                        self._last.labels(name).set(record.metrics[name])
                    else:
                        self._adapter_last.labels(record.adapter, name).set(record.metrics[name])
            for name, value in record.metrics.items():
                if name.startswith("reward/"):
                    self._reward.labels(name.removeprefix("reward/")).set(value)

    # ------------------------------------------------------------------ export
    def prometheus(self) -> bytes:
        return generate_latest(self.registry)

    def close(self) -> None:
        with self._lock:
            for sink in self.sinks:
                try:
                    sink.close()
                except Exception:
                    log.exception("closing metric sink %s failed", type(sink).__name__)
            self.jsonl.close()
            self.trainlog.close()
