"""Where a server keeps files that other processes on the same machine look for."""

from __future__ import annotations

from pathlib import Path

ADMIN_TOKEN_FILE = "admin_token"


def admin_token_path(data_dir: Path) -> Path:
    """The admin token a server generated for itself (owner-only), in its data dir."""
    return data_dir / ADMIN_TOKEN_FILE


def local_admin_token_file(home: Path, port: int) -> Path:
    """A copy of that token, found by ``ajet ctl`` / ``ajet status`` from the server's port alone."""
    return home / "tokens" / f"admin-{port}"
