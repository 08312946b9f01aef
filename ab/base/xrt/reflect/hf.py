"""Map a Hugging Face `config.json` onto a config class through the fields' `hf` metadata."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from xrt.reflect.build import build
from xrt.reflect.dump import to_dict
from xrt.reflect.walk import FieldInfo, fields_of

T = TypeVar("T")
_MISSING = object()


def _lookup(config: Mapping[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def hf_values(cls: type, config: Mapping[str, Any], *, defaults: bool = False) -> dict[str, Any]:
    """{field: value} for every field (nested classes as nested dicts) whose HF key is in `config`.
    The first alternative present wins; values are returned unconverted. With `defaults`, a field whose
    keys are all absent takes its `hf_default` (the value an HF config would use), where it has one."""
    out: dict[str, Any] = {}
    for info in fields_of(cls):
        if info.is_group:
            sub = hf_values(info.type, config, defaults=defaults)
            if sub:
                out[info.name] = sub
            continue
        value = _first_present(config, info.hf)
        if value is _MISSING and defaults and info.hf and info.hf_default is not attrs.NOTHING:
            value = info.hf_default
        if value is not _MISSING:
            out[info.name] = value
    return out


def hf_missing(cls: type, config: Mapping[str, Any], prefix: str = "") -> list[FieldInfo]:
    """The HF-mapped fields (depth first, dotted paths) with no key in `config` and no `hf_default`: config.json
    must give them (a model's shape), or any other model's values would be used for this checkpoint."""
    out: list[FieldInfo] = []
    for info in fields_of(cls, prefix):
        if info.is_group:
            out += hf_missing(info.type, config, info.path)
        elif info.hf and info.hf_default is attrs.NOTHING and _first_present(config, info.hf) is _MISSING:
            out.append(info)
    return out


def _first_present(config: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        value = _lookup(config, key)
        if value is not _MISSING:
            return value
    return _MISSING


def merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: values of `top` win; nested mappings merge."""
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def from_hf(cls: type[T], config: Mapping[str, Any], base: Mapping[str, Any] | T | None = None, *,
            path: str = "") -> T:
    """An instance of `cls` from an HF config dict; fields it does not map keep `base` (or defaults)."""
    if base is not None and not isinstance(base, Mapping):
        base = to_dict(base)
    return build(cls, merge(base or {}, hf_values(cls, config)), path=path)
