"""The flat dict a component is built from: one class's own fields, nested groups left out."""

from __future__ import annotations

import enum
from typing import Any

import attrs


def flat(obj: Any, *, enums_as_values: bool = False) -> dict[str, Any]:
    if not attrs.has(type(obj)):
        raise TypeError(f"flat needs an attrs instance, got {type(obj).__name__}")
    out: dict[str, Any] = {}
    for a in attrs.fields(type(obj)):
        value = getattr(obj, a.name)
        if attrs.has(type(value)):
            continue
        if enums_as_values and isinstance(value, enum.Enum):
            value = value.value
        out[a.name] = value
    return out
