"""The ``ajet`` command line: ``server`` (generated from the settings), ``run``, ``status``, ``ctl``, ``up``,
``demo``, ``model``, ``export``, ``generator``, ``bench``, ``research``, ``verifiers``."""

from __future__ import annotations

import typer

from agentjet.cli import bench, client, ctl, research, swarm, verifiers
from agentjet.cli.export import export
from agentjet.cli.generator import generator
from agentjet.cli.server import EPILOG, make_server_command

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="AgentJet: swarm RL training for LLM agents.")


def _print_version(value: bool) -> None:
    if value:
        from agentjet import __version__

        typer.echo(f"agentjet {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """AgentJet: swarm RL training for LLM agents."""


app.command("server", epilog=EPILOG)(make_server_command())
app.command("run")(client.run)
app.command("status")(client.status)
app.command("up")(swarm.up)
app.command("demo")(swarm.make_demo_command())
app.command("model")(swarm.model)
app.command("export")(export)
app.command("generator")(generator)
app.command("bench")(bench.bench)
app.command("research")(research.research)
app.command("verifiers")(verifiers.verifiers)
app.add_typer(ctl.app, name="ctl")


def main() -> None:
    app()
