"""``ajet status`` as a person reads it: a few small rich tables (the run, its buffers, throughput, the last step)
rendered from one ``ServerStatus``. ``ajet status --json`` prints the server's answer as it came."""

from __future__ import annotations

import math
from typing import Any

from rich.columns import Columns
from rich.console import RenderableType
from rich.table import Table

from agentjet.protocol import ServerStatus

# The last step's metrics shown first, when the step has them (then the rest of the main ones, up to ``MAX_METRICS``).
MAIN_METRICS = ("reward_mean", "loss", "grad_norm", "episodes", "groups", "mismatch_kl", "staleness/mean",
                "time/training_s", "time/sync_s", "time/waiting_s")
MAX_METRICS = 10


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        return f"{value:.4g}"
    return str(value)


def _table(title: str, rows: list[tuple[str, Any]]) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", box=None, show_header=False,
                  padding=(0, 1), min_width=len(title) + 2)
    table.add_column("what", style="dim")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value if isinstance(value, str) else fmt(value))
    return table


def version_text(st: ServerStatus) -> str:
    """The served version, and the learner's beside it when it is ahead (a push in flight, or one that failed)."""
    text = f"v{st.policy_version}"
    if st.learner_version is not None and st.learner_version != st.policy_version:
        text += f" (learner v{st.learner_version}{', pushing' if st.weight_push_in_flight else ''})"
    elif st.weight_push_in_flight:
        text += " (pushing)"
    return text


def run_rows(st: ServerStatus) -> list[tuple[str, Any]]:
    info = st.engine_info
    where = ", ".join(str(info[k]) for k in ("device", "dtype") if info.get(k) is not None)
    rows: list[tuple[str, Any]] = [("model", st.model), ("layout", st.engine)]
    if where:
        rows.append(("runs on", where))
    rows += [("state", st.engine_state), ("policy version", version_text(st)), ("train steps", st.train_steps),
             ("clients", len(st.clients))]
    if st.weight_syncs is not None:
        failed = f" ({fmt(st.weight_sync_failures)} failed)" if st.weight_sync_failures else ""
        rows.append(("weight syncs", f"{fmt(st.weight_syncs)}{failed}"))
    if st.training_halted:
        rows.append(("training halted", f"[red]{st.training_halted}[/red]"))
    return rows


def buffer_rows(st: ServerStatus) -> list[tuple[str, Any]]:
    b = st.buffer
    return [("open", b.open_episodes), ("pending", b.pending_episodes), ("trained", b.trained_episodes),
            ("eval", b.eval_episodes), ("dropped stale", b.dropped_stale_episodes),
            ("dropped uniform", b.dropped_uniform_episodes), ("expired", b.expired_episodes),
            ("aborted", b.aborted_episodes)]


def throughput_rows(st: ServerStatus) -> list[tuple[str, Any]]:
    t = st.throughput
    rows: list[tuple[str, Any]] = []
    if "uptime_s" in t:
        rows.append(("uptime", f"{t['uptime_s'] / 60:.1f} min"))
    if "calls" in t:
        rows.append(("chat calls", f"{fmt(t['calls'])} ({t.get('calls_per_s', 0.0):.2f}/s)"))
    if "generated_tokens" in t:
        rows.append(("generated tokens", f"{fmt(t['generated_tokens'])} ({t.get('tokens_per_s', 0.0):.1f}/s)"))
    if "episodes_ended" in t:
        rows.append(("episodes ended", t["episodes_ended"]))
    if "admission_capacity" in t:
        rows.append(("admission", f"capacity {fmt(t['admission_capacity'])}, waiting "
                     f"{fmt(t.get('admission_waiting'))}, refused {fmt(t.get('admission_refusals'))}"))
    return rows


def last_step_rows(st: ServerStatus) -> list[tuple[str, Any]]:
    m = st.last_train_metrics
    names = [k for k in MAIN_METRICS if k in m][:MAX_METRICS]
    return [(k, m[k]) for k in names]


def task_types_table(st: ServerStatus) -> Table:
    """Trained episodes and mean reward per task type, and its difficulty level when its clients note one."""
    types = Table(title="Task types", title_justify="left", title_style="bold", box=None, padding=(0, 1),
                  header_style="dim")
    types.add_column("type")
    types.add_column("trained", justify="right")
    types.add_column("reward", justify="right")
    if st.levels:
        types.add_column("level", justify="right")
    for name in sorted(st.task_types.keys() | st.levels.keys()):
        v = st.task_types.get(name, {})
        row = [name, fmt(v.get("episodes", 0)), fmt(v.get("reward_mean"))]
        types.add_row(*row, *([fmt(st.levels.get(name))] if st.levels else []))
    return types


def status_view(st: ServerStatus) -> RenderableType:
    """Everything ``ajet status`` prints (without ``--json``)."""
    parts: list[RenderableType] = [_table("Run", run_rows(st)), _table("Episodes", buffer_rows(st)),
                                   _table("Throughput", throughput_rows(st))]
    step = last_step_rows(st)
    parts.append(_table(f"Last step ({st.train_steps})", step) if step else _table("Last step", [("", "none yet")]))
    if st.task_types or st.levels:
        parts.append(task_types_table(st))
    if st.eval_reward:
        evals = list(st.eval_reward.items())[-5:]  # the latest versions
        parts.append(_table("Eval reward", [(f"v{v}", r) for v, r in evals]))
    return Columns(parts, padding=(1, 3))  # side by side as the width allows
