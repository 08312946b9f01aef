"""What a field's annotation means: scalar, enum, list, dict, optional or a nested config class."""

from __future__ import annotations

import collections.abc
import enum
import functools
import types
import typing
from typing import Any

import attrs

SCALARS: tuple[type, ...] = (bool, int, float, str)


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of an attrs class (they are strings under `from __future__ import annotations`)."""
    hints = typing.get_type_hints(cls)
    return {a.name: hints.get(a.name, a.type if a.type is not None else Any) for a in attrs.fields(cls)}


def is_config_class(tp: Any) -> bool:
    return isinstance(tp, type) and attrs.has(tp)


def is_enum(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, enum.Enum)


def optional_inner(tp: Any) -> Any | None:
    """T for `T | None` / `Optional[T]`, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
    return None


def list_item(tp: Any) -> Any | None:
    """T for `list[T]` (or tuple[T, ...] / Sequence[T]), else None."""
    origin = typing.get_origin(tp)
    if origin in (list, tuple, collections.abc.Sequence) or tp in (list, tuple):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return args[0] if args else Any
    return None


def dict_types(tp: Any) -> tuple[Any, Any] | None:
    """(K, V) for `dict[K, V]`, else None."""
    origin = typing.get_origin(tp)
    if origin is dict or tp is dict:
        args = typing.get_args(tp)
        return (args[0], args[1]) if args else (Any, Any)
    return None


def type_name(tp: Any) -> str:
    """How a type reads in help and error messages: `int`, `list[int]`, `eager|cudagraph`, `float | null`."""
    inner = optional_inner(tp)
    if inner is not None:
        return f"{type_name(inner)} | null"
    if is_enum(tp):
        return "|".join(str(m.value) for m in tp)
    item = list_item(tp)
    if item is not None:
        return f"list[{type_name(item)}]"
    kv = dict_types(tp)
    if kv is not None:
        return f"dict[{type_name(kv[0])}, {type_name(kv[1])}]"
    if is_config_class(tp):
        return "group"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))
