"""Client-side commands: ``ajet run`` (drive a workflow over a dataset) and ``ajet status``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import typer

from agentjet.cli.common import admin_token_for, console, env_secret, fail

SERVER_URL = "http://127.0.0.1:10086"


def run(
    workflow: str = typer.Argument(..., help="path/to/workflow.py:fn with `async def fn(task, ep) -> reward`"),
    server_url: str = typer.Option(SERVER_URL, "--server", help="swarm server URL"),
    dataset: Path = typer.Option(..., help="JSONL file, one task object per line"),
    group_size: int | None = typer.Option(None, min=1, help="episodes per task (GRPO group); default: the "
                                          "server's group_size"),
    concurrency: int = typer.Option(8, min=1, help="episodes in flight at once"),
    token: str | None = typer.Option(None, help="swarm token (or $AGENTJET_SWARM_TOKEN[_FILE])"),
    client_id: str | None = typer.Option(None, help="a stable id: a restarted client releases its old episodes"),
    eval: bool = typer.Option(False, "--eval", help="run as eval episodes (never trained on)"),
    epochs: int = typer.Option(1, min=1, help="passes over the dataset"),
    cursor: Path | None = typer.Option(None, help="file recording finished tasks, to resume a run"),
    limit: int | None = typer.Option(None, min=1, help="use only the first N tasks"),
) -> None:
    """Drive a workflow over a dataset against a swarm server."""
    from agentjet.client.runner import Cursor, load_dataset, load_workflow

    try:
        fn = load_workflow(workflow)
        tasks = load_dataset(dataset, limit)
    except (ValueError, OSError) as exc:
        fail(str(exc))
    if epochs > 1 and cursor is not None:
        fail("--cursor resumes a single pass; it cannot be combined with --epochs > 1")
    summary = asyncio.run(_run(fn, tasks, server_url, token or env_secret("AGENTJET_SWARM_TOKEN"), client_id,
                               group_size, concurrency, eval, epochs, Cursor(cursor)))
    console.print(f"{summary.episodes} episodes, {summary.failed} failed, mean reward {summary.mean_reward:.3f}, "
                  f"{summary.seconds:.0f}s")
    if summary.samples:  # what the server built from the calls (timeline merging: one sample for a whole chat)
        console.print(f"{summary.calls} chat calls -> {summary.samples} training samples "
                      f"({summary.merge_ratio:.2f} calls per sample)")
    if summary.failed:
        console.print(f"failures by kind: {dict(summary.failure_kinds)}")


async def _run(fn: Any, tasks: list[dict[str, Any]], url: str, token: str | None, client_id: str | None,
               group_size: int | None, concurrency: int, eval: bool, epochs: int, cursor: Any) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentjet.client.client import SwarmClient
    from agentjet.client.runner import RunSummary, run_workflow

    total_summary = RunSummary()
    async with SwarmClient(url, token=token, client_id=client_id) as client:
        size = client.group_size(group_size)
        total = len(tasks) * size * epochs
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[info]}"), console=console) as progress:
            bar = progress.add_task("episodes", total=total, info="")

            def update(s: RunSummary) -> None:
                recent = s.rewards[-64:]
                mean = sum(recent) / len(recent) if recent else float("nan")
                progress.update(bar, completed=total_summary.episodes + s.episodes,
                                info=f"reward {mean:.3f}  policy v{s.last_policy_version}  failed {s.failed}")

            for _ in range(epochs):
                s = await run_workflow(client, fn, tasks, group_size=size, concurrency=concurrency, eval=eval,
                                       cursor=cursor, on_progress=update)
                total_summary.merge(s)
    return total_summary


def status(
    server_url: str = typer.Option(SERVER_URL, "--server"),
    token: str | None = typer.Option(None, help="swarm or admin token (default: $AGENTJET_ADMIN_TOKEN, "
                                     "$AGENTJET_SWARM_TOKEN, or a local server's own admin token file)"),
    as_json: bool = typer.Option(False, "--json", help="print the server's whole answer as JSON"),
) -> None:
    """Print a server's status: engine, layout, versions, episodes, throughput, the last step (--json: all of it)."""
    import httpx

    token = token or env_secret("AGENTJET_SWARM_TOKEN") or admin_token_for(server_url, None)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(f"{server_url.rstrip('/')}/swarm/v1/status", headers=headers, timeout=10)
    except httpx.TransportError as exc:
        fail(f"cannot reach {server_url}: {exc}")
    if r.status_code != 200:
        fail(f"HTTP {r.status_code}: {r.text}")
    if as_json:
        console.print_json(json.dumps(r.json()))
        return
    from agentjet.cli.status_view import status_view
    from agentjet.protocol import ServerStatus

    console.print(status_view(ServerStatus.model_validate(r.json())))
