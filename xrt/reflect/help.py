"""The `--help` / `config fields` table: one row per field, from the attrs metadata."""

from __future__ import annotations

import json

import attrs

from xrt.reflect.dump import to_plain
from xrt.reflect.types import type_name
from xrt.reflect.walk import walk


def show_default(value: object) -> str:
    if value is attrs.NOTHING:
        return "(required)"
    plain = to_plain(value)
    if isinstance(plain, str):
        return plain if plain else '""'
    return json.dumps(plain)


def help_rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted path, type, default, help) for every leaf field."""
    rows = []
    for info in walk(cls, prefix):
        text = info.help + (f" [{info.unit}]" if info.unit else "")
        if info.hf:
            text += f" (HF: {info.hf[0]})"
        rows.append((info.path, type_name(info.type), show_default(info.default), text))
    return rows


def help_table(cls: type, prefix: str = "") -> str:
    return format_rows(help_rows(cls, prefix))


def format_rows(body: list[tuple[str, str, str, str]]) -> str:
    """`help_rows` (or a selection of them) as the aligned table, with its header."""
    rows = [("field", "type", "default", "help"), *body]
    # Long defaults (lists) would push the help column off screen; cap the column they widen.
    widths = [min(max(len(r[i]) for r in rows), cap) for i, cap in enumerate((48, 32, 24))]
    lines = []
    for r in rows:
        cells = [r[i].ljust(widths[i]) if len(r[i]) <= widths[i] else r[i] for i in range(3)]
        lines.append("  ".join([*cells, r[3]]).rstrip())
    return "\n".join(lines)
