"""Config objects as plain data (enums as their values), YAML or JSON."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Any

import attrs


def to_plain(value: Any) -> Any:
    """Plain Python data: attrs instances become dicts, enums their values, tuples lists."""
    if attrs.has(type(value)):
        return {a.name: to_plain(getattr(value, a.name)) for a in attrs.fields(type(value))}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {to_plain(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def to_dict(obj: Any) -> dict[str, Any]:
    if not attrs.has(type(obj)):
        raise TypeError(f"to_dict needs an attrs instance, got {type(obj).__name__}")
    return to_plain(obj)


def to_yaml(obj: Any) -> str:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> Any:
        # Lists of scalars on one line (`batch: [1, 2, 3]`); groups stay blocks.
        scalar = all(not isinstance(x, (dict, list)) for x in data)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=scalar)

    Dumper.add_representer(list, represent_list)
    return yaml.dump(to_dict(obj), Dumper=Dumper, sort_keys=False, default_flow_style=False, width=1 << 16)


def to_json(obj: Any, *, indent: int | None = 2) -> str:
    return json.dumps(to_dict(obj), indent=indent)
