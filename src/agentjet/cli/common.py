"""What every ``ajet`` command shares: the console, failing with a message, and finding tokens."""

from __future__ import annotations

import ipaddress
import os
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
