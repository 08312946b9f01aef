"""JSON Schema (draft 2020-12) of a config class: types, enums, defaults, descriptions, bounds."""

from __future__ import annotations

from typing import Any

import attrs

from xrt.reflect.dump import to_plain
from xrt.reflect.types import dict_types, is_config_class, is_enum, list_item, optional_inner
from xrt.reflect.walk import FieldInfo, fields_of

DRAFT = "https://json-schema.org/draft/2020-12/schema"
_JSON_TYPES: dict[Any, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}
_BOUNDS = {"minimum": "minimum", "maximum": "maximum", "exclusive_minimum": "exclusiveMinimum",
           "exclusive_maximum": "exclusiveMaximum"}


def json_schema(cls: type) -> dict[str, Any]:
    schema = {"$schema": DRAFT, "title": cls.__name__}
    schema.update(_class_schema(cls))
    return schema


def _class_schema(cls: type) -> dict[str, Any]:
    props = {info.name: _field_schema(info) for info in fields_of(cls)}
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if cls.__doc__ and not cls.__doc__.startswith(f"{cls.__name__}("):
        out["description"] = cls.__doc__.strip()
    return out


def _field_schema(info: FieldInfo) -> dict[str, Any]:
    schema = _type_schema(info.type, _validators(info.attribute.validator))
    if info.help:
        schema["description"] = info.help + (f" [{info.unit}]" if info.unit else "")
    if info.default is not attrs.NOTHING:
        schema["default"] = to_plain(info.default)
    return schema


def _type_schema(tp: Any, validators: list[Any]) -> dict[str, Any]:
    inner = optional_inner(tp)
    if inner is not None:
        return {"anyOf": [_type_schema(inner, validators), {"type": "null"}]}
    if is_config_class(tp):
        return _class_schema(tp)
    if is_enum(tp):
        values = [m.value for m in tp]
        kinds = sorted({_JSON_TYPES.get(type(v), "string") for v in values})
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": values}
    item = list_item(tp)
    if item is not None:
        items = [v.items for v in validators if hasattr(v, "items")]
        return {"type": "array", "items": _type_schema(item, items)}
    kv = dict_types(tp)
    if kv is not None:
        return {"type": "object", "additionalProperties": _type_schema(kv[1], [])}
    out: dict[str, Any] = {"type": _JSON_TYPES[tp]} if tp in _JSON_TYPES else {}
    for v in validators:
        for attr, key in _BOUNDS.items():
            if hasattr(v, attr):
                out[key] = getattr(v, attr)
    return out


def _validators(v: Any) -> list[Any]:
    """attrs combines a list of validators into one; take it apart again."""
    if v is None:
        return []
    parts = getattr(v, "_validators", None)
    if parts is not None:
        return [x for p in parts for x in _validators(p)]
    return [v]
