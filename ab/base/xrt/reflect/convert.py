"""Scalar conversion with messages that read well after a dotted path: `must be an integer, got 'abc'`."""

from __future__ import annotations

import math
from typing import Any

from xrt.reflect.suggest import did_you_mean
from xrt.reflect.types import is_enum

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def show(value: Any) -> str:
    """A value as the user would have typed it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    return repr(value)


def to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"must be an integer, got {show(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            try:
                f = float(value)
            except ValueError:
                f = math.nan
            if f.is_integer():
                return int(f)
    raise ValueError(f"must be an integer, got {show(value)}")


def to_float(value: Any) -> float:
    f = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        f = float(value)
    elif isinstance(value, str):
        try:
            f = float(value.strip())
        except ValueError:
            pass
    if math.isfinite(f):
        return f
    raise ValueError(f"must be a finite number, got {show(value)}")


def to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        s = value.strip().lower()
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
    raise ValueError(f"must be true or false, got {show(value)}")


def to_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    raise ValueError(f"must be a string, got {show(value)}")


def to_enum(value: Any, tp: type) -> Any:
    if isinstance(value, tp):
        return value
    members = list(tp)
    for m in members:
        if m.value == value and type(m.value) is type(value):
            return m
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        s = str(value).strip().lower()
        for m in members:
            if str(m.value).lower() == s or m.name.lower() == s:
                return m
    allowed = [str(m.value) for m in members]
    hint = did_you_mean(str(value), allowed) if isinstance(value, str) else ""
    raise ValueError(f"must be one of {', '.join(allowed)}, got {show(value)}{hint}")


def to_scalar(value: Any, tp: Any) -> Any:
    """Convert to int/float/bool/str or an enum; other types are called with the value."""
    if is_enum(tp):
        return to_enum(value, tp)
    if tp is bool:
        return to_bool(value)
    if tp is int:
        return to_int(value)
    if tp is float:
        return to_float(value)
    if tp is str:
        return to_str(value)
    if isinstance(value, tp):
        return value
    try:
        return tp(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"must be {getattr(tp, '__name__', tp)}, got {show(value)} ({e})") from None
