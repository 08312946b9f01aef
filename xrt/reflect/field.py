"""The one way to declare a config field: an attrs field whose metadata carries help text,
the HF `config.json` key it maps to, and a unit. Everything else in `xrt.reflect` reads this."""

from __future__ import annotations

from typing import Any

import attrs

HELP = "xrt.help"
HF_KEY = "xrt.hf"
UNIT = "xrt.unit"


def field(
    default: Any = attrs.NOTHING,
    *,
    help: str,
    hf: str | None = None,
    unit: str | None = None,
    validator: Any = None,
    factory: Any = None,
) -> Any:
    """A reflected attrs field. `validator` takes reflect validators (or any attrs validator)."""
    metadata = {HELP: help, HF_KEY: hf, UNIT: unit}
    if factory is not None:
        return attrs.field(factory=factory, validator=validator, metadata=metadata)
    return attrs.field(default=default, validator=validator, metadata=metadata)


def help_of(a: attrs.Attribute) -> str:
    return a.metadata.get(HELP, "")


def hf_key_of(a: attrs.Attribute) -> str | None:
    return a.metadata.get(HF_KEY)


def unit_of(a: attrs.Attribute) -> str | None:
    return a.metadata.get(UNIT)
