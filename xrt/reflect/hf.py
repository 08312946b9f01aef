"""Map a Hugging Face `config.json` onto a config class through the fields' `hf` metadata."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from xrt.reflect.build import build
from xrt.reflect.dump import to_dict
from xrt.reflect.walk import fields_of

T = TypeVar("T")
_MISSING = object()


def _lookup(config: Mapping[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def hf_values(cls: type, config: Mapping[str, Any]) -> dict[str, Any]:
    """{field: value} for every field (nested classes as nested dicts) whose HF key is in `config`.
    The first alternative present wins; values are returned unconverted."""
    out: dict[str, Any] = {}
    for info in fields_of(cls):
        if info.is_group:
            sub = hf_values(info.type, config)
            if sub:
                out[info.name] = sub
            continue
        for key in info.hf:
            value = _lookup(config, key)
            if value is not _MISSING:
                out[info.name] = value
                break
    return out


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
