"""``ajet generator``: a generator replica for a swarm server's router (``agentjet.apps.generator``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import typer

from agentjet.cli.common import console, fail, require_server_extra


def generator(
    join: str = typer.Option(..., "--join", metavar="HOST:PORT", help="the server's join address "
                             "(generator.fleet.listen, --replica-listen)"),
    name: str | None = typer.Option(None, "--name", help="this replica's name in the fleet (default: <host>-<pid>); "
                                    "a replica that joins again under its name takes its place back"),
    model: str | None = typer.Option(None, "--model", help="this machine's copy of the served model (default: the "
                                     "server's model path, which must exist here)"),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda or cuda:N (default: the server's)"),
    threads: int | None = typer.Option(None, "--threads", min=1, max=512, help="torch CPU threads"),
    token_file: Path | None = typer.Option(None, "--token-file", help="a file holding the fleet's secret (else "
                                           "$AGENTJET_GENERATOR__FLEET__TOKEN; the server writes it to "
                                           "<data_dir>/fleet.token)"),
    connect_timeout_s: float = typer.Option(120.0, "--connect-timeout", min=1.0, help="seconds to keep dialing"),
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING or ERROR"),
) -> None:
    """Serve as one generator replica of a swarm server (the server routes episodes to it and pushes each new
    version of the weights to it). The secret comes from a file or the environment, never the command line."""
    require_server_extra("generator")
    from agentjet.generators.fleet.wire import TOKEN_ENV

    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            fail(f"--token-file {token_file}: {exc.strerror or exc}")
    else:
        token = os.environ.get(TOKEN_ENV, "")
    if not token:
        fail(f"no fleet secret: pass --token-file PATH or set {TOKEN_ENV}")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from agentjet.apps.generator import Overrides, run_replica

    try:
        why = run_replica(join, token, name, Overrides(model, device, threads), connect_timeout_s)
    except (ConnectionError, ValueError) as exc:
        fail(str(exc))
    console.print(f"replica stopped: {why}", soft_wrap=True)
