"""What every ``ajet`` command shares: the console, failing with a message, finding tokens, and the check that
a server command has the server extra (the base install is a client)."""

from __future__ import annotations

import importlib.metadata
import ipaddress
import os
import re
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlparse

import typer
from rich.console import Console
from rich.markup import escape

from agentjet.models import agentjet_home
from agentjet.settings.paths import local_admin_token_file

console = Console()


def fail(message: str, code: int = 2) -> NoReturn:
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)  # plain text: agentjet[ray] stays
    raise typer.Exit(code)


SERVER_EXTRA = "server"


def missing_server_packages() -> list[str]:
    """The distributions of the ``server`` extra (as the installed package declares them) that are not installed;
    none when AgentJet runs from a source tree without its metadata."""
    try:
        requires = importlib.metadata.requires("agentjet") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    missing = []
    for req in requires:
        name, _, marker = req.partition(";")
        if not re.search(rf"extra\s*==\s*['\"]{SERVER_EXTRA}['\"]", marker):
            continue
        dist = re.split(r"[\s\[<>=!~(]", name.strip(), maxsplit=1)[0]
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(dist)
    return missing


def require_server_extra(command: str) -> None:
    """Fail with the install line when a command that runs a server (or a model) lacks the server extra."""
    missing = missing_server_packages()
    if missing:
        fail(f"`ajet {command}` needs the server extra ({', '.join(missing)} not installed): "
             f"pip install 'agentjet[{SERVER_EXTRA}]'. The base install runs clients only (ajet run, status, ctl).")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def env_secret(env: str) -> str | None:
    """A token from ``$ENV``, else from the file named by ``$ENV_FILE``."""
    if os.environ.get(env):
        return os.environ[env]
    path = os.environ.get(f"{env}_FILE")
    return Path(path).expanduser().read_text().strip() if path else None


def admin_token_for(server_url: str, given: str | None) -> str | None:
    """The admin token: the option, else ``$AGENTJET_ADMIN_TOKEN[_FILE]``, else (for a server on this machine)
    the token file the server wrote when it generated its own."""
    token = given or env_secret("AGENTJET_ADMIN_TOKEN")
    if token:
        return token
    url = urlparse(server_url)
    if url.hostname and is_loopback(url.hostname):
        path = local_admin_token_file(agentjet_home(), url.port or (443 if url.scheme == "https" else 80))
        if path.exists():
            return path.read_text().strip()
    return None
