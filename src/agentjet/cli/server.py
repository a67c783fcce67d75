"""``ajet server``: its options are generated from ``ServerConfig`` (one per leaf setting, grouped by section,
with the setting's description, bounds and default as help: ``agentjet.cli.options``), so a new setting needs no
edit here."""

from __future__ import annotations

import inspect
import logging
import os
from pathlib import Path
from typing import Any

import typer

from agentjet.cli.common import console, fail, is_loopback, require_server_extra
from agentjet.cli.options import command, given, option, param_name
from agentjet.settings import (
    ServerConfig,
    SettingField,
    SettingsError,
    find_field,
    load_server_config,
    server_fields,
)
from agentjet.settings.load import nest, read_secret_file
from agentjet.settings.moved import MOVED_FLAGS

EPILOG = ("Every option is also an environment variable: --port is AGENTJET_PORT, --group-size "
          "AGENTJET_TRAINING__GROUP_SIZE (AGENTJET_<SECTION>__<NAME>); a token also comes from a file named by "
          "AGENTJET_SWARM_TOKEN_FILE / AGENTJET_ADMIN_TOKEN_FILE. Settings marked 'live' can be changed while the "
          "server runs: ajet ctl set. See docs/configuration.md.")


def _help(field: SettingField) -> str:
    if field.section == "server":
        return field.help_text()
    return f"({field.section}{', live' if field.live else ''}) {field.help_text()}"


def _options() -> list[inspect.Parameter]:
    params = [inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None, default=typer.Option(
        None, "--config", "-c", help="a YAML/TOML/JSON file of settings, nested by section (precedence: options > "
        "this file > AGENTJET_* environment > defaults)"))]
    for f in server_fields():
        params.append(option(f, _help(f)))
        if f.is_secret:
            file_opt = typer.Option(None, f"--{f.flag}-file", help=f"a file holding the {f.flag.replace('-', ' ')}",
                                    show_default=False)
            params.append(inspect.Parameter(param_name(f, "__file"), inspect.Parameter.KEYWORD_ONLY,
                                            default=file_opt, annotation=Path | None))
    for old, new in MOVED_FLAGS.items():  # accepted only to be refused with the new name
        is_bool = find_field(new).is_bool
        opt = typer.Option(None, f"--{old}/--no-{old}" if is_bool else f"--{old}", hidden=True)
        params.append(inspect.Parameter(_moved_param(old), inspect.Parameter.KEYWORD_ONLY, default=opt,
                                        annotation=bool | None if is_bool else str | None))
    return params


def _moved_param(old_flag: str) -> str:
    return "moved__" + old_flag.replace("-", "_")


def refuse_moved_flags(kwargs: dict[str, Any]) -> None:
    """A flag renamed for its role (``--train-nnodes`` is ``--learner-nnodes``) fails with the new name."""
    used = [f"--{old} moved to --{new}" for old, new in MOVED_FLAGS.items()
            if kwargs.get(_moved_param(old)) is not None]
    if used:
        fail("; ".join(used))


def cli_values(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The options given on the command line, nested like ``ServerConfig`` (left-out options are absent)."""
    flat = given(server_fields(), kwargs)
    for f in server_fields():
        if f.is_secret and f.path not in flat and kwargs.get(param_name(f, "__file")) is not None:
            flat[f.path] = read_secret_file(kwargs[param_name(f, "__file")], f"--{f.flag}-file")
    return nest(flat)


def check_bind(config: ServerConfig) -> None:
    """A public bind needs both tokens (or --allow-insecure): otherwise anyone on the network could run
    episodes and control training."""
    if is_loopback(config.host) or (config.swarm_token and config.admin_token):
        return
    msg = (f"binding to {config.host} without both a swarm token and an admin token lets anyone on the network "
           "run episodes and control training")
    if not config.allow_insecure:
        console.print(f"[red]refusing:[/red] {msg}. Set --swarm-token and --admin-token, or pass --allow-insecure.",
                      soft_wrap=True)
        raise typer.Exit(2)
    console.print(f"[bold red]WARNING:[/bold red] {msg}.", soft_wrap=True)


def server(**kwargs: Any) -> None:
    """Run a swarm server: one trainable model behind an OpenAI-compatible API."""
    require_server_extra("server")
    refuse_moved_flags(kwargs)
    try:
        config = load_server_config(cli_values(kwargs), kwargs.get("config"), os.environ)
    except SettingsError as exc:
        fail(f"invalid settings:\n{exc}")
    check_bind(config)
    from agentjet.observe.metrics import MissingExtra, check_sinks_available

    try:
        check_sinks_available(config.observe.log_to)
    except MissingExtra as exc:
        fail(f"--log-to: {exc}")
    from agentjet.runtime.omp import prefer_passive_openmp

    prefer_passive_openmp()  # before torch loads
    from agentjet.models import ModelNotFoundError, agentjet_home, resolve_model

    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        resolve_model(config.model, config.model_revision)
    except ModelNotFoundError as exc:
        fail(str(exc))
    vllm_python = config.generator.vllm.python_path()
    if config.generator.kind == "vllm" and not vllm_python.exists():
        fail(f"--vllm-python {vllm_python} does not exist: run `make setup-vllm` (or point --vllm-python at a "
             "Python with vLLM installed)")
    from agentjet.layouts import PlacementError, check_placement

    try:
        check_placement(config)  # before any process or model starts
    except PlacementError as exc:
        fail(str(exc))
    config.data_dir = config.resolved_data_dir(agentjet_home())
    from agentjet.server.http.app import serve

    console.print(f"AgentJet server: model [bold]{config.model}[/bold] on http://{config.host}:{config.port}/v1, "
                  f"engine {config.generator.kind.value}, data in {config.data_dir}", soft_wrap=True)
    serve(config)


def make_server_command() -> Any:
    return command(server, _options())
