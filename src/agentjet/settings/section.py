"""What every settings section shares: the base model (unknown keys refused, assignments validated), the ``LIVE``
mark, and the parsers that read a list or a mapping from one CLI or environment string."""

from __future__ import annotations

import json
import shlex
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

LIVE: dict[str, Any] = {"live": True}  # a setting that may change while the server runs (`ajet ctl set`)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def split_list(value: Any) -> Any:
    """``"a,b,c"`` (a CLI or environment value) -> ``["a", "b", "c"]``; anything else is left to pydantic."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


def parse_mapping(value: Any) -> Any:
    """``"math=0.7,code=0.3"`` or a JSON object (CLI or environment) -> a dict; anything else is left to pydantic."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("{"):
        return json.loads(text)
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"item {item!r} must look like name=value (e.g. math=0.7,code=0.3)")
        out[name.strip()] = raw.strip()
    return out


def split_args(value: Any) -> Any:
    """Command-line words: a JSON list, or a string split like a shell would."""
    if isinstance(value, str):
        return json.loads(value) if value.strip().startswith("[") else shlex.split(value)
    return value


CommaList = Annotated[list[str], BeforeValidator(split_list)]
