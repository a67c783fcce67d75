"""Commands that start whole swarms or models: ``ajet up``, ``ajet demo`` (its options generated from
``DemoSettings``), ``ajet model``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from agentjet.apps.demo import RECOMMENDED_RUN, DemoSettings
from agentjet.cli.common import console, fail, require_server_extra
from agentjet.cli.options import command, given, option
from agentjet.models import DEFAULT_MODEL
from agentjet.settings import EngineKind, SettingField
from agentjet.settings.fields import model_fields
from agentjet.settings.load import nest


def model(name: str = typer.Argument(DEFAULT_MODEL, help="built-in name, local HF directory or hub id ORG/NAME"),
          revision: str | None = typer.Option(None, help="branch, tag or commit of a hub model (default: main)"),
          ) -> None:
    """Resolve (and on first use convert, build or download) a model; print its local directory."""
    require_server_extra("model")
    from agentjet.models import ModelNotFoundError, resolve_model

    try:
        console.print(str(resolve_model(name, revision)), soft_wrap=True)
    except ModelNotFoundError as exc:
        fail(str(exc))


def _demo_help(field: SettingField) -> str:
    """The option's help; a run setting the task recommends defaults to the task's value."""
    if field.path[0] == "run" and len(field.path) == 2 and field.path[-1] in RECOMMENDED_RUN:
        return f"{field.info.description} [{field.bounds_text() or 'any'}; default: the task's recommendation]"
    if field.path[:2] == ("run", "level_rule"):
        return (f"{field.info.description} [{field.bounds_text() or 'any'}; default: the task's recommendation, else "
                f"{field.default_text()}]")
    return field.help_text()


def demo(**kwargs: Any) -> None:
    """Train SmolLM2 on a built-in task through a real swarm server and client; print eval before/after."""
    require_server_extra("demo")
    from agentjet.apps.demo import run_demo
    from agentjet.tasks import TaskError, get_task, ladders

    try:
        settings = DemoSettings.model_validate(nest(given(model_fields(DemoSettings), kwargs)))
    except ValidationError as exc:
        fail(f"invalid settings:\n{exc}")
    try:
        task = get_task(settings.task)
    except TaskError as exc:
        fail(f"--task: {exc}")
    if settings.levels and not ladders(task):
        fail(f"--levels: {settings.task} has no difficulty levels (addition, rg: datasets with a reasoning-gym "
             "curriculum and GuessTheNumber have them: docs/environments.md)")
    if settings.engine is EngineKind.NULL:
        fail("--engine null cannot learn: the demo needs hf or vllm")
    result = run_demo(settings, console)
    if result.eval_after <= result.eval_before:
        console.print("[yellow]the eval reward did not improve in this run[/yellow]")


def make_demo_command() -> Any:
    """``ajet demo``, its options generated from ``DemoSettings`` (its ``run``: the client's ``RunSettings``)."""
    return command(demo, [option(f, _demo_help(f)) for f in model_fields(DemoSettings)])


def up(spec_file: Path = typer.Argument(..., help="swarm YAML: servers (and optionally clients)")) -> None:
    """Start a set of servers and clients described in one file; Ctrl-C stops them cleanly."""
    require_server_extra("up")
    import signal

    from agentjet.apps.up import Swarm, load_spec
    from agentjet.runtime.launch import ServerExited

    try:
        spec = load_spec(spec_file)
    except ValueError as exc:
        fail(str(exc))
    swarm = Swarm(spec, echo=console.print)

    def on_sigterm(*_: object) -> None:
        raise KeyboardInterrupt  # stop cleanly on SIGTERM, as on Ctrl-C

    signal.signal(signal.SIGTERM, on_sigterm)
    failed: list[str] = []
    try:
        swarm.start()
        failed = [name for name, code in swarm.wait().items() if code != 0]
    except KeyboardInterrupt:
        console.print("stopping ...")
    except (RuntimeError, ServerExited, TimeoutError) as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        swarm.stop()
        raise typer.Exit(1) from exc
    swarm.stop()
    if failed:
        console.print(f"[red]error:[/red] client(s) {failed} failed; see their logs in {spec.log_dir}")
        raise typer.Exit(1)
