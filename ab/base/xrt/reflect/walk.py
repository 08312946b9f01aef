"""Walk nested attrs config classes: one `FieldInfo` per field, with its dotted path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from xrt.reflect.errors import join_path
from xrt.reflect.field import help_of, hf_default_of, hf_keys_of, unit_of
from xrt.reflect.types import field_types, is_config_class


@attrs.frozen
class FieldInfo:
    path: str
    name: str
    type: Any
    default: Any
    help: str
    unit: str | None
    hf: tuple[str, ...]
    hf_default: Any  # attrs.NOTHING: config.json must hold one of the `hf` keys
    attribute: attrs.Attribute
    owner: type

    @property
    def is_group(self) -> bool:
        return is_config_class(self.type)

    @property
    def hf_key(self) -> str | None:
        return self.hf[0] if self.hf else None


def default_of(a: attrs.Attribute) -> Any:
    """The field's default value (a factory is called), or attrs.NOTHING when it is required."""
    d = a.default
    if isinstance(d, attrs.Factory):  # type: ignore[arg-type]
        return d.factory(None) if d.takes_self else d.factory()
    return d


def fields_of(cls: type, prefix: str = "") -> list[FieldInfo]:
    """The direct fields of one class."""
    tps = field_types(cls)
    return [
        FieldInfo(
            path=join_path(prefix, a.name),
            name=a.name,
            type=tps[a.name],
            default=default_of(a),
            help=help_of(a),
            unit=unit_of(a),
            hf=hf_keys_of(a),
            hf_default=hf_default_of(a),
            attribute=a,
            owner=cls,
        )
        for a in attrs.fields(cls)
    ]


def walk(cls: type, prefix: str = "", *, groups: bool = False) -> Iterator[FieldInfo]:
    """Every leaf field, depth first in declaration order; with `groups=True` nested classes too,
    each yielded before its own fields."""
    for info in fields_of(cls, prefix):
        if info.is_group:
            if groups:
                yield info
            yield from walk(info.type, info.path, groups=groups)
        else:
            yield info


def find(cls: type, path: str) -> FieldInfo | None:
    """The field at a dotted path, or None."""
    head, _, rest = path.partition(".")
    for info in fields_of(cls):
        if info.name == head:
            if not rest:
                return info
            if info.is_group:
                sub = find(info.type, rest)
                if sub is None:
                    return None
                return attrs.evolve(sub, path=f"{head}.{sub.path}")
            return None
    return None
