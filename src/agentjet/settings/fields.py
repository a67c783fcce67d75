"""The leaf settings of ``ServerConfig``, walked once: each one's path, CLI flag, environment variable,
bounds and help text. The CLI, the environment loader, ``ajet up`` options and ``ajet ctl set`` keys all
come from this table, so a setting declared in its role's file (``generator.py``, ``learner.py``,
``placement.py``, ``training.py``, ``server.py``) reaches every entrance with no other edit.

Naming: a top-level field ``port`` is ``--port`` and ``AGENTJET_PORT``; a section field
``training.group_size`` is ``--group-size`` and ``AGENTJET_TRAINING__GROUP_SIZE``; a field of a nested
block ``learner.lora.rank`` is ``--lora-rank`` and ``AGENTJET_LEARNER__LORA__RANK``; a block with a
``FLAG_PREFIX`` puts it before the name (``learner.group.nnodes`` is ``--learner-nnodes``). A field may rename its
flag or add aliases (``json_schema_extra={"flag": ..., "aliases": [...]}``) and is live when marked so
(``"live": True``). A name that moved (``agentjet.settings.moved``) is refused with the new one.
"""

from __future__ import annotations

import difflib
import enum
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from agentjet.settings.moved import MOVED_FLAGS, dotted, new_path
from agentjet.settings.server import ServerConfig

ENV_PREFIX = "AGENTJET_"
ENV_NESTED = "__"
SECRET_FILE_SUFFIX = "_FILE"


@dataclass(frozen=True)
class SettingField:
    path: tuple[str, ...]
    info: FieldInfo
    flag: str  # without the leading dashes
    aliases: tuple[str, ...]

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    @property
    def section(self) -> str:
        return self.path[0] if len(self.path) > 1 else "server"

    @property
    def env(self) -> str:
        return ENV_PREFIX + ENV_NESTED.join(self.path).upper()

    @property
    def annotation(self) -> Any:
        return self.info.annotation

    @property
    def is_bool(self) -> bool:
        return _strip_optional(self.annotation) is bool

    @property
    def is_secret(self) -> bool:
        return _strip_optional(self.annotation) is SecretStr

    @property
    def live(self) -> bool:
        """Whether it may change while the server runs (``ajet ctl set``): marked on the field itself
        (``json_schema_extra=LIVE``, ``settings/section.py``)."""
        extra = self.info.json_schema_extra
        return bool(isinstance(extra, dict) and extra.get("live"))

    @property
    def choices(self) -> list[str] | None:
        inner = _strip_optional(self.annotation)
        if isinstance(inner, type) and issubclass(inner, enum.Enum):
            return [str(m.value) for m in inner]
        if typing.get_origin(inner) is Literal:
            return [str(a) for a in typing.get_args(inner)]
        return None

    def default_text(self) -> str:
        factory = self.info.default_factory
        value = factory() if factory is not None else self.info.default  # type: ignore[call-arg]
        if value is None or value == {} or value == [] or value == ():
            return "none"
        if isinstance(value, enum.Enum):
            return str(value.value)
        if isinstance(value, list | tuple):
            return ",".join(map(str, value))
        return str(value).lower() if isinstance(value, bool) else str(value)

    def bounds_text(self) -> str:
        lo = hi = ""
        for m in self.info.metadata:
            if isinstance(m, annotated_types.Ge):
                lo = f"{m.ge} ≤ "
            elif isinstance(m, annotated_types.Gt):
                lo = f"{m.gt} < "
            elif isinstance(m, annotated_types.Le):
                hi = f" ≤ {m.le}"
            elif isinstance(m, annotated_types.Lt):
                hi = f" < {m.lt}"
        if lo or hi:
            return f"{lo}x{hi}"
        choices = self.choices
        return "|".join(choices) if choices else ""

    def help_text(self) -> str:
        """The description, then the bounds (or choices) and the default: the ``--help`` line."""
        extra = [b for b in (self.bounds_text(),) if b]
        if not self.is_secret and self.default_text() != "none":
            extra.append(f"default {self.default_text()}")
        return f"{self.info.description or ''} [{'; '.join(extra)}]" if extra else (self.info.description or "")


def _strip_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _submodel(annotation: Any) -> type[BaseModel] | None:
    inner = _strip_optional(annotation)
    return inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None


def _walk(model: type[BaseModel], prefix: tuple[str, ...]) -> list[SettingField]:
    out: list[SettingField] = []
    flag_prefix = getattr(model, "FLAG_PREFIX", None)  # a block whose flags carry a prefix ("--learner-nnodes")
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        sub = _submodel(info.annotation)
        if sub is not None:
            out += _walk(sub, path)
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        # the section name is dropped ("--group-size"); a nested block's name is kept ("--lora-rank"), or its
        # prefix stands for the path ("--learner-nnodes" for learner.group.nnodes)
        parts = (flag_prefix, name) if flag_prefix else path[1:] if len(path) > 1 else path
        default_flag = "-".join(parts).replace("_", "-")
        flag = str(extra.get("flag", default_flag))
        aliases = tuple(str(a) for a in extra.get("aliases", ()))  # type: ignore[union-attr]
        out.append(SettingField(path, info, flag, aliases))
    return out


@functools.cache
def server_fields() -> tuple[SettingField, ...]:
    """Every leaf setting of ``ServerConfig``, in declaration order. Flags are checked to be unique."""
    return model_fields(ServerConfig)


@functools.cache
def model_fields(model: type[BaseModel]) -> tuple[SettingField, ...]:
    """Every leaf setting of a settings model (``ServerConfig``, or another command's, e.g. ``ajet demo``'s), in
    declaration order, named as above. Flags are checked to be unique."""
    fields = tuple(_walk(model, ()))
    seen: dict[str, str] = {}
    for f in fields:
        for name in (f.flag, *f.aliases):
            if name in seen:
                raise RuntimeError(f"settings {seen[name]} and {f.dotted} share the flag --{name}")
            seen[name] = f.dotted
    return fields


def _normalise(key: str) -> str:
    return key.strip().lstrip("-").replace("_", "-").lower()


def find_field(key: str) -> SettingField:
    """A setting by its dotted path (``training.group_size``), flag (``--group-size``, ``group-size``,
    ``group_size``) or alias (``lr``). Raises ``KeyError`` with close matches."""
    fields = server_fields()
    for f in fields:
        if key == f.dotted:
            return f
    want = _normalise(key)
    for f in fields:
        if want in (f.flag, *f.aliases) or want == _normalise(f.dotted.replace(".", "-")):
            return f
    moved = new_path(tuple(key.strip().lstrip("-").split(".")))
    if moved is not None:
        raise KeyError(f"{key} moved to {dotted(moved)}")
    if want in MOVED_FLAGS:
        raise KeyError(f"--{want} moved to --{MOVED_FLAGS[want]}")
    names = [f.flag for f in fields] + [f.dotted for f in fields]
    close = difflib.get_close_matches(want, names, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise KeyError(f"unknown setting {key!r}{hint}")
