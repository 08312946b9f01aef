"""`build(cls, mapping)`: the only way a config object is made from user input. Rejects unknown
keys, converts types, runs every attrs validator and each class's cross-field `check()`, and
raises one ConfigError listing every problem with its dotted path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from xrt.reflect.convert import show, to_scalar
from xrt.reflect.errors import ConfigError, Problem, join_path
from xrt.reflect.suggest import closest
from xrt.reflect.types import dict_types, field_types, is_config_class, list_item, optional_inner
from xrt.reflect.walk import default_of

T = TypeVar("T")


class _Invalid:
    """Marks a value that could not be converted (its problem is already recorded)."""


INVALID: Any = _Invalid()
_NULL_STRINGS = {"null", "none", "~"}


def build(cls: type[T], mapping: Mapping[str, Any] | T | None, *, path: str = "") -> T:
    """An instance of attrs class `cls` from a (nested) mapping; missing keys take their defaults."""
    if isinstance(mapping, cls):
        from xrt.reflect.dump import to_dict

        mapping = to_dict(mapping)
    problems: list[Problem] = []
    obj = build_into(cls, mapping, path, problems)
    if problems or obj is INVALID:
        raise ConfigError(problems or [(path, "invalid")])
    return obj


def build_into(cls: type, mapping: Any, path: str, problems: list[Problem]) -> Any:
    """Like `build`, appending problems instead of raising; returns INVALID when it cannot build an instance
    (a value of the wrong type, a missing field), else the instance even if values failed their validators."""
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, Mapping):
        problems.append((path, f"must be a group of fields ({cls.__name__}), got {show(mapping)}"))
        return INVALID
    start = len(problems)
    attributes = {a.name: a for a in attrs.fields(cls)}
    for key in mapping:
        if key not in attributes:
            problems.append((join_path(path, str(key)), _unknown(str(key), path, list(attributes))))
    types = field_types(cls)
    values: dict[str, Any] = {}
    # Problems per field, so they come out in declaration order whichever pass found them.
    per_field: dict[str, list[Problem]] = {name: [] for name in attributes}
    for name, a in attributes.items():
        fpath = join_path(path, name)
        if name in mapping:
            values[name] = convert(mapping[name], types[name], fpath, per_field[name])
        else:
            default = default_of(a)
            if default is attrs.NOTHING:
                per_field[name].append((fpath, "required, not given"))
                values[name] = INVALID
            else:
                values[name] = default
    inst = None
    if all(v is not INVALID for v in values.values()):
        try:
            with attrs.validators.disabled():
                inst = cls(**values)
        except (TypeError, ValueError) as e:
            problems.append((path, _message(e)))
            return INVALID
    for name, a in attributes.items():
        if a.validator is not None and values[name] is not INVALID:
            try:
                a.validator(inst, a, values[name])
            except Exception as e:  # any validator failure is a user problem, reported with its path
                per_field[name].append((join_path(path, name), _message(e)))
        problems.extend(per_field[name])
    if inst is None:
        return INVALID
    # Cross-field rules run even when fields failed their validators (every value has its type), so one run
    # reports both; a rule that crashes on such a value, or names a field already reported, adds nothing. The
    # instance is returned either way so the enclosing class's rules run too (`build` raises on any problem).
    _run_check(inst, path, problems, reported=problems[start:])
    return inst


def convert(value: Any, tp: Any, path: str, problems: list[Problem]) -> Any:
    """`value` as type `tp`; a scalar given for a list becomes a one-element list."""
    inner = optional_inner(tp)
    if inner is not None:
        if value is None or (inner is not str and isinstance(value, str) and value.strip().lower() in _NULL_STRINGS):
            return None
        tp = inner
    if tp is Any:
        return value
    if is_config_class(tp):
        return build_into(tp, value, path, problems)
    if value is None:
        problems.append((path, f"must be {_kind(tp)}, got null"))
        return INVALID
    item = list_item(tp)
    if item is not None:
        if isinstance(value, Mapping):
            problems.append((path, f"must be a list, got {show(dict(value))}"))
            return INVALID
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        out = [convert(x, item, f"{path}[{i}]", problems) for i, x in enumerate(items)]
        return INVALID if any(x is INVALID for x in out) else out
    kv = dict_types(tp)
    if kv is not None:
        if not isinstance(value, Mapping):
            problems.append((path, f"must be a mapping, got {show(value)}"))
            return INVALID
        result: dict[Any, Any] = {}
        for k, v in value.items():
            kpath = join_path(path, str(k))
            key = convert(k, kv[0], kpath, problems)
            result[key] = convert(v, kv[1], kpath, problems)
        return INVALID if INVALID in result or any(v is INVALID for v in result.values()) else result
    if isinstance(value, (list, tuple, Mapping)):
        problems.append((path, f"must be {_kind(tp)}, got {show(value)}"))
        return INVALID
    try:
        return to_scalar(value, tp)
    except ValueError as e:
        problems.append((path, str(e)))
        return INVALID


def _run_check(inst: Any, path: str, problems: list[Problem], reported: list[Problem]) -> None:
    check = getattr(inst, "check", None)
    if not callable(check):
        return
    try:
        found = check()
    except Exception as e:  # a crashing cross-field rule must still come out as one clean line
        if not reported:
            problems.append((path, f"invalid combination of values ({type(e).__name__}: {e})"))
        return
    known = {p for p, _ in reported}
    for rel, message in found or []:
        if join_path(path, rel) not in known:
            problems.append((join_path(path, rel), message))


def _unknown(key: str, path: str, names: list[str]) -> str:
    hit = closest(key, names)
    if hit is not None:
        return f"unknown field; did you mean {join_path(path, hit)}?"
    return f"unknown field; known here: {', '.join(names)}"


def _kind(tp: Any) -> str:
    from xrt.reflect.types import is_enum, type_name

    if is_enum(tp):
        return f"one of {', '.join(str(m.value) for m in tp)}"
    name = type_name(tp)
    return {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}.get(name, name)


def _message(e: BaseException) -> str:
    if e.args and isinstance(e.args[0], str):
        return e.args[0]
    return str(e) or type(e).__name__
