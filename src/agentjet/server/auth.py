"""Who may do what. Three secrets (``docs/protocol.md``):

- the swarm token gates join and begin (open when none is set, on a loopback bind);
- the admin token gates the control plane and other episodes' traces. It is always set: a server started
  without one generates it (``new_admin_token``) and leaves it in an owner-only file (``save_admin_token``);
- an episode key authorises its own episode only.

``Auth`` holds digests of the tokens, never the tokens. The FastAPI dependencies in ``http/deps.py`` read the
bearer token with ``HTTPBearer`` and check it against the ``Auth`` kept on the app's state.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path

from agentjet.files import write_atomic
from agentjet.server.digest import digest, matches
from agentjet.server.errors import unauthorized
from agentjet.settings import ServerConfig
from agentjet.settings.paths import admin_token_path, local_admin_token_file

log = logging.getLogger(__name__)


class Auth:
    def __init__(self, swarm_token: str | None, admin_token: str) -> None:
        self._swarm = digest(swarm_token) if swarm_token else None
        self._admin = digest(admin_token)

    @classmethod
    def from_config(cls, config: ServerConfig) -> Auth:
        admin = ServerConfig.secret(config.admin_token)
        if admin is None:
            raise ValueError("the admin token is not set: generate one with new_admin_token first")
        return cls(ServerConfig.secret(config.swarm_token), admin)

    def is_admin(self, token: str | None) -> bool:
        return matches(token, self._admin)

    def is_swarm(self, token: str | None) -> bool:
        return self._swarm is None or matches(token, self._swarm)

    def check_swarm(self, token: str | None) -> None:
        if not self.is_swarm(token):
            raise unauthorized("a valid swarm token is required (Authorization: Bearer <swarm token>)")

    def check_admin(self, token: str | None) -> None:
        if not self.is_admin(token):
            raise unauthorized("this action needs the admin token (Authorization: Bearer <admin token>)")

    def check_swarm_or_admin(self, token: str | None) -> None:
        if not (self.is_swarm(token) or self.is_admin(token)):
            raise unauthorized("this needs the swarm token or the admin token")


def _write_owner_only(path: Path, text: str) -> None:
    write_atomic(path, text + "\n", mode=0o600)


def new_admin_token() -> str:
    """A fresh admin token: 256 random bits."""
    return "aj-admin-" + secrets.token_urlsafe(32)


def save_admin_token(token: str, data_dir: Path, home: Path, port: int) -> Path:
    """Write a generated admin token owner-only to the data dir and to ``$AGENTJET_HOME/tokens/admin-<port>``
    (where ``ajet ctl`` on this machine looks). Returns the data dir's file."""
    path = admin_token_path(data_dir)
    _write_owner_only(path, token)
    if port:
        _write_owner_only(local_admin_token_file(home, port), token)
    log.warning("no admin token was given: generated one, in %s (owner-only); `ajet ctl` on this machine finds "
                "it by itself", path)
    return path
