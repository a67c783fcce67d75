"""``ajet research``: plan, run, watch and report an RL study on the swarm (``agentjet.apps.research``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import typer

from agentjet.cli.common import console, fail, require_server_extra


def research(
    study: str = typer.Argument(..., help="a study file (STUDY.yaml), a question with --base and --space, or a "
                                           "topic alone: the planner designs the study"),
    base: Path | None = typer.Option(None, help="with a question: the `ajet up` spec every trial starts from"),
    space: list[str] = typer.Option([], "--space", help="with a question: e.g. server.lr=1e-5..1e-4:log or "
                                                        "server.group-size=4,8 (repeatable)"),
    client: list[str] = typer.Option([], "--client", help="a trial-client setting, e.g. steps=6 (repeatable)"),
    seeds: int | None = typer.Option(None, min=1, help="runs per configuration"),
    parallel: int | None = typer.Option(None, min=1, help="runs at a time"),
    trials: int | None = typer.Option(None, min=1, help="budget: runs in all"),
    minutes: float | None = typer.Option(None, min=0.0, help="budget: no new run starts after this many minutes"),
    planner: str | None = typer.Option(None, help="tpe, random, grid or llm"),
    planner_url: str | None = typer.Option(None, help="OpenAI-compatible base URL: the LLM planner"),
    planner_model: str | None = typer.Option(None, help="model name for the LLM planner"),
    out: Path | None = typer.Option(None, help="study directory (default runs/research/<name>); run the same "
                                               "command again to continue a stopped study"),
    report_only: bool = typer.Option(False, help="only rewrite report.md and the results from the study dir"),
    program: bool = typer.Option(False, help="with a topic: a program of studies, each designed from the last "
                                             "report, until --trials or --hours is spent"),
    hours: float | None = typer.Option(None, min=0.0, help="with --program: the program's budget in hours"),
    dry_run: bool = typer.Option(False, help="with a topic: design the study, show it and write spec.yaml; run nothing"),
    ray: str | None = typer.Option(None, help="run each trial as a Ray actor on this cluster: its address "
                                              "(host:port), auto (the `ray start` cluster here) or local (needs "
                                              "the ray extra)"),
    ray_cpus: float | None = typer.Option(None, min=0.0, help="with --ray: CPUs each trial reserves (default 1)"),
    ray_gpus_per_server: float | None = typer.Option(None, min=0.0, help="with --ray: GPUs each of a trial's "
                                                                         "servers reserves (default 0)"),
) -> None:
    """Plan, run, watch and report an RL study on the swarm (resumable; see docs/research.md)."""
    if not (report_only or dry_run):  # the trials run servers
        require_server_extra("research")
    try:
        from agentjet.apps.research.app import main as research_main
    except ImportError as exc:
        fail(f"{exc}; install the research extra: pip install 'agentjet[research]'")
    overrides = {k: v for k, v in {"seeds": seeds, "parallel": parallel, "budget.trials": trials,
                                   "budget.minutes": minutes, "planner.kind": planner, "planner.url": planner_url,
                                   "planner.model": planner_model, "ray.cpus": ray_cpus,
                                   "ray.gpus_per_server": ray_gpus_per_server}.items() if v is not None}
    if ray is not None and importlib.util.find_spec("ray") is None:
        fail("--ray needs Ray, which is not installed: pip install 'agentjet[ray]'")
    from agentjet.apps.research.app import is_topic, topic_main

    if is_topic(study, space) and not report_only:
        code = topic_main(study, base, client, overrides, out, program, hours, dry_run, console, ray)
    else:
        code = research_main(study, base, space, client, overrides, out, report_only, console, ray)
    if code:
        raise typer.Exit(code)
