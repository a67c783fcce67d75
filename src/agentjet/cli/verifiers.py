"""``ajet verifiers``: run a verifiers 0.4 environment's episodes against a swarm server, from the verifiers venv
(``make setup-verifiers``; docs/environments.md)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import typer

from agentjet.cli.client import SERVER_URL
from agentjet.cli.common import console, env_secret, fail


def _json_object(text: str, flag: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"{flag} is not JSON: {exc.msg}")
    if not isinstance(value, dict):
        fail(f"{flag} must be a JSON object")
    return value


def verifiers(
    taskset: str = typer.Argument(..., help="the verifiers taskset id: a package installed in the verifiers venv, "
                                  "or one under --path (e.g. ajet-reverse-text with --path examples/verifiers)"),
    server_url: str = typer.Option(SERVER_URL, "--server", help="swarm server URL"),
    path: list[Path] = typer.Option([], "--path", help="a directory the worker imports tasksets from (repeatable)"),
    env_id: str = typer.Option("", help="a verifiers env id to pair with the taskset (default: the taskset's own)"),
    harness: str = typer.Option("null", help="every agent's harness (verifiers' own default, bash, runs the "
                                "model's code)"),
    runtime: str = typer.Option("subprocess", help="every agent's runtime (verifiers' own default is Prime's cloud "
                                "sandbox)"),
    limit: int | None = typer.Option(None, min=1, help="the first N tasks (needed for an endless taskset)"),
    group_size: int | None = typer.Option(None, min=1, help="episodes per task; default: the server's group_size"),
    concurrency: int = typer.Option(4, min=1, help="episodes in flight at once"),
    epochs: int = typer.Option(1, min=1, help="passes over the tasks"),
    max_tokens: int | None = typer.Option(None, min=1, help="max_tokens of every call"),
    sampling: str = typer.Option("{}", help="sampling of every call, as JSON (verifiers' SamplingConfig)"),
    env_config: str = typer.Option("{}", help="more of the verifiers env's config, as JSON"),
    verifiers_python: Path | None = typer.Option(None, help="the verifiers venv's python (default: "
                                                 "$AGENTJET_VERIFIERS_PYTHON, else .venv-verifiers/bin/python)"),
    token: str | None = typer.Option(None, help="swarm token (or $AGENTJET_SWARM_TOKEN[_FILE])"),
    client_id: str | None = typer.Option(None, help="a stable id: a restarted client releases its old episodes"),
    out: Path | None = typer.Option(None, help="write the report (every episode's reward and reply) here, as JSON"),
    worker_log: Path | None = typer.Option(None, help="the worker's log file (default: a temporary directory)"),
    loopback_only: bool = typer.Option(False, help="the worker refuses every address that is not loopback (checked "
                                       "where its connections resolve)"),
) -> None:
    """Run a verifiers environment's episodes against a swarm server: each begins on the swarm, runs through
    verifiers with the episode's base URL and key, and ends with the environment's reward."""
    from agentjet.apps.verifiers import WorkerError, WorkerOptions

    options = WorkerOptions(taskset=taskset, env_id=env_id, paths=tuple(p.resolve() for p in path), harness=harness,
                            runtime=runtime, limit=limit, env_config=_json_object(env_config, "--env-config"),
                            sampling={**_json_object(sampling, "--sampling"),
                                      **({"max_tokens": max_tokens} if max_tokens else {})},
                            loopback_only=loopback_only)
    try:
        report = asyncio.run(_run(options, verifiers_python, worker_log, server_url,
                                  token or env_secret("AGENTJET_SWARM_TOKEN"), client_id, group_size, concurrency,
                                  epochs))
    except WorkerError as exc:
        fail(str(exc))
    if out is not None:
        from agentjet.runtime.provenance import git_commit, machine

        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"commit": git_commit(), "machine": machine(), "server": server_url,
                                   **report.to_json()}, indent=2))
    mean = "n/a" if report.mean_reward is None else f"{report.mean_reward:.3f}"
    console.print(f"{report.env_id}: {report.episodes} episodes ({report.tasks} tasks x {report.group_size} x "
                  f"{epochs}), {report.acknowledged} acknowledged, {report.failed} failed, mean reward {mean}, "
                  f"policy v{report.policy_version_before} -> v{report.policy_version_after}")
    if report.failed:
        errors = {e for r in report.records for e in r.errors}
        console.print(f"errors: {sorted(errors)[:5]}")


async def _run(options: Any, python: Path | None, log: Path | None, url: str, token: str | None,
               client_id: str | None, group_size: int | None, concurrency: int, epochs: int) -> Any:
    from agentjet.apps.verifiers import VerifiersWorker, run_verifiers
    from agentjet.client.client import SwarmClient

    async with SwarmClient(url, token=token, client_id=client_id) as client, \
            VerifiersWorker(options, python=python, log_path=log) as worker:
        return await run_verifiers(client, worker, group_size=group_size, concurrency=concurrency, epochs=epochs)
