"""Command options generated from a settings model: one option per leaf setting, with its flag and aliases, and its
description, bounds and default as help (``agentjet.settings.fields``); and the values given on the command line,
by path. ``ajet server`` (``ServerConfig``) and ``ajet demo`` (``DemoSettings``, whose ``run`` is the client's
``RunSettings``) are made this way, so a setting declared in its model reaches the command with no edit here."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import typer

from agentjet.settings import SettingField


def param_name(field: SettingField, suffix: str = "") -> str:
    return field.dotted.replace(".", "__") + suffix


def _metavar(field: SettingField) -> str:
    if field.choices:
        return "CHOICE"
    kinds = [a for a in typing.get_args(field.annotation) if a is not type(None)] or [field.annotation]
    return {int: "INT", float: "FLOAT"}.get(kinds[0], "TEXT") if len(kinds) == 1 else "TEXT"


def option(field: SettingField, help_text: str, hidden: bool = False) -> inspect.Parameter:
    """The option of ``field``: ``--flag/--no-flag`` for a switch, else ``--flag VALUE`` (and its aliases), left
    out (None) unless given."""
    if field.is_bool:
        opt = typer.Option(None, f"--{field.flag}/--no-{field.flag}", help=help_text, show_default=False,
                           hidden=hidden)
        return inspect.Parameter(param_name(field), inspect.Parameter.KEYWORD_ONLY, default=opt,
                                 annotation=bool | None)
    opt = typer.Option(None, f"--{field.flag}", *(f"--{a}" for a in field.aliases), help=help_text,
                       show_default=False, metavar=_metavar(field), hidden=hidden)
    return inspect.Parameter(param_name(field), inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=str | None)


def given(fields: tuple[SettingField, ...], kwargs: dict[str, Any]) -> dict[tuple[str, ...], Any]:
    """The options given (left-out ones are absent), by path, as typed: the model parses them."""
    return {f.path: kwargs[param_name(f)] for f in fields if kwargs.get(param_name(f)) is not None}


def command(fn: Callable[..., Any], params: list[inspect.Parameter]) -> Callable[..., Any]:
    """``fn(**kwargs)`` with ``params`` as its signature, for typer."""
    fn.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    fn.__annotations__ = {p.name: p.annotation for p in params}
    return fn
