"""Build a ``ServerConfig`` from its entrances, in this order of precedence (a later one wins):

1. the defaults declared in ``agentjet.settings`` (``ServerConfig``, ``settings/server.py``, and its sections);
2. ``AGENTJET_*`` environment variables (``AGENTJET_PORT``, ``AGENTJET_TRAINING__GROUP_SIZE``; a secret
   also from a file named by ``AGENTJET_SWARM_TOKEN_FILE``);
3. a config file (``--config server.yaml``: YAML, TOML or JSON, nested like the model);
4. command-line options (``--group-size 8``; a secret also from ``--swarm-token-file PATH``).

The explicit beats the ambient: what a command line or a named file says wins over the environment.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from agentjet.files import write_atomic
from agentjet.settings.fields import (
    ENV_NESTED,
    ENV_PREFIX,
    SECRET_FILE_SUFFIX,
    find_field,
    server_fields,
)
from agentjet.settings.moved import env_name, moved_in, moved_message, new_path
from agentjet.settings.server import ServerConfig


class SettingsError(ValueError):
    """Settings that cannot be read or do not validate. The message names each field (and its flag)."""


def nest(flat: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    """``{("training", "group_size"): 8}`` -> ``{"training": {"group_size": 8}}``."""
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def deep_merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Merge nested dicts; a later layer wins key by key."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(out.get(key), dict):
                out[key] = deep_merge(out[key], value)
            else:
                out[key] = dict(value) if isinstance(value, Mapping) else value
    return out


def read_secret_file(path: str | Path, what: str) -> str:
    try:
        return Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise SettingsError(f"{what}: cannot read the secret file {path}: {exc.strerror or exc}") from exc


def env_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings given as ``AGENTJET_*`` variables. A misspelt sectioned name is an error (a top-level one
    cannot be told apart from unrelated variables such as ``AGENTJET_HOME``)."""
    flat: dict[tuple[str, ...], Any] = {}
    known: set[str] = set()
    for f in server_fields():
        known.update((f.env, f.env + SECRET_FILE_SUFFIX) if f.is_secret else (f.env,))
        if f.env in environ:
            flat[f.path] = environ[f.env]
        elif f.is_secret and environ.get(f.env + SECRET_FILE_SUFFIX):
            flat[f.path] = read_secret_file(environ[f.env + SECRET_FILE_SUFFIX], f.env + SECRET_FILE_SUFFIX)
    moved = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or ENV_NESTED not in name or name in known:
            continue
        stem = name.removesuffix(SECRET_FILE_SUFFIX)
        target = new_path(tuple(stem.removeprefix(ENV_PREFIX).lower().split(ENV_NESTED)))
        if target is not None:
            moved.append(moved_message(name, env_name(target) + name[len(stem):]))
    if moved:
        raise SettingsError(f"settings in the environment under old names: {'; '.join(moved)}")
    unknown = sorted(k for k in environ if k.startswith(ENV_PREFIX) and ENV_NESTED in k and k not in known)
    if unknown:
        raise SettingsError(f"unknown settings in the environment: {', '.join(unknown)} (see ajet server --help)")
    return nest(flat)


def read_config_file(path: Path) -> dict[str, Any]:
    """A YAML, TOML or JSON file holding (part of) a ``ServerConfig``, nested like the model."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SettingsError(f"cannot read the config file {path}: {exc.strerror or exc}") from exc
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SettingsError(f"the config file {path} cannot be parsed: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"the config file {path} must hold a mapping of settings, not {type(data).__name__}")
    return data


def options_values(options: Mapping[str, Any]) -> dict[str, Any]:
    """Settings keyed by flag, alias or dotted path (``ajet up`` options, ``ajet ctl set``) -> nested values."""
    flat: dict[tuple[str, ...], Any] = {}
    for key, value in options.items():
        try:
            field = find_field(key)
        except KeyError as exc:
            raise SettingsError(str(exc.args[0])) from exc
        flat[field.path] = value
    return nest(flat)


def _label(loc: tuple[Any, ...]) -> str:
    dotted = ".".join(str(x) for x in loc)
    try:
        field = find_field(dotted)
    except KeyError:
        return dotted or "settings"
    return f"{field.dotted} (--{field.flag})"


def describe(exc: ValidationError) -> str:
    """One line per problem, each naming the setting and its flag."""
    lines = []
    for err in exc.errors():
        loc = tuple(x for x in err.get("loc", ()) if not (isinstance(x, str) and x.startswith("function-")))
        got = err.get("input")
        shown = "" if isinstance(got, dict) or err.get("type") == "missing" else f" (got {got!r})"
        lines.append(f"{_label(loc)}: {err.get('msg')}{shown}")
    return "\n".join(lines)


def validate(values: Mapping[str, Any]) -> ServerConfig:
    moved = moved_in(values)
    if moved:
        raise SettingsError("; ".join(moved) + " (see docs/configuration.md)")
    try:
        return ServerConfig.model_validate(values)
    except ValidationError as exc:
        raise SettingsError(describe(exc)) from exc


def load_server_config(cli: Mapping[str, Any] | None = None, config_file: Path | None = None,
                       environ: Mapping[str, str] | None = None) -> ServerConfig:
    """Defaults < environment < config file < command line (see the module docstring)."""
    layers = [env_values(environ or {})]
    if config_file is not None:
        layers.append(read_config_file(config_file))
    layers.append(dict(cli or {}))
    return validate(deep_merge(*layers))


def dump_config(config: ServerConfig, *, reveal_secrets: bool) -> dict[str, Any]:
    """The config as plain data for a config file. Secrets, at any depth, are written only when asked (the file
    is then made owner-only by ``write_config_file``); otherwise each is masked. An unset (None) value is left
    out: every optional setting defaults to None (``tests/settings/test_settings.py`` holds that rule), so the reader
    gets the same None back."""
    data = config.model_dump(mode="json", exclude_none=True)
    for f in server_fields():
        value: Any = config
        for part in f.path:
            value = getattr(value, part)
        if value is None or not f.is_secret:
            continue
        node = data
        for part in f.path[:-1]:
            node = node.setdefault(part, {})
        node[f.path[-1]] = ServerConfig.secret(value) if reveal_secrets else "**********"
    return data


def write_config_file(config: ServerConfig, path: Path) -> Path:
    """Write a config file a child ``ajet server --config`` reads back (owner-only: it may hold tokens)."""
    return write_atomic(path, yaml.safe_dump(dump_config(config, reveal_secrets=True), sort_keys=False), mode=0o600)
