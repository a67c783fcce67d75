"""Print, as JSON, everything the server settings show the outside: for each setting its path, CLI flag and aliases,
environment variable, default, bounds, choices, description, live mark and type; the JSON schema of ``ServerConfig``;
the defaults as a config file holds them; the table of moved names; and ``ajet server --help``.

For a refactor of ``agentjet/settings/``: run it before and after, and diff the two files::

    .venv/bin/python scripts/settings_surface.py > /tmp/before.json
    # ... the change ...
    .venv/bin/python scripts/settings_surface.py > /tmp/after.json
    diff /tmp/before.json /tmp/after.json
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agentjet.cli import app
from agentjet.settings import ServerConfig, server_fields
from agentjet.settings.moved import MOVED, MOVED_FLAGS, MOVED_SECTIONS


def surface() -> dict[str, object]:
    fields = [{"path": f.dotted, "flag": f.flag, "aliases": list(f.aliases), "env": f.env,
               "default": f.default_text(), "bounds": f.bounds_text(), "choices": f.choices,
               "description": f.info.description, "live": f.live, "secret": f.is_secret, "bool": f.is_bool,
               "type": repr(f.annotation), "help": f.help_text()} for f in server_fields()]
    help_text = CliRunner().invoke(app, ["server", "--help"], terminal_width=200).output
    return {"fields": fields, "schema": ServerConfig.model_json_schema(),
            "defaults": ServerConfig().model_dump(mode="json"),
            "moved": {"paths": {".".join(k): ".".join(v) for k, v in MOVED.items()}, "flags": MOVED_FLAGS,
                      "sections": MOVED_SECTIONS},
            "help": help_text.splitlines()}


if __name__ == "__main__":
    print(json.dumps(surface(), indent=1, sort_keys=True))
