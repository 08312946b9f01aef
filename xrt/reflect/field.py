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
    hf: str | tuple[str, ...] | None = None,
    unit: str | None = None,
    validator: Any = None,
    factory: Any = None,
) -> Any:
    """A reflected attrs field. `validator` takes reflect validators (or any attrs validator).

    `hf` names the HF `config.json` key; a dotted key reaches into a nested object
    (`rope_parameters.rope_theta`), and a tuple lists alternatives tried in order."""
    metadata = {HELP: help, HF_KEY: hf, UNIT: unit}
    if factory is not None:
        return attrs.field(factory=factory, validator=validator, metadata=metadata)
    return attrs.field(default=default, validator=validator, metadata=metadata)


def help_of(a: attrs.Attribute) -> str:
    return a.metadata.get(HELP, "")


def hf_keys_of(a: attrs.Attribute) -> tuple[str, ...]:
    key = a.metadata.get(HF_KEY)
    if key is None:
        return ()
    return (key,) if isinstance(key, str) else tuple(key)


def hf_key_of(a: attrs.Attribute) -> str | None:
    """The primary HF key (the first alternative), or None."""
    keys = hf_keys_of(a)
    return keys[0] if keys else None


def unit_of(a: attrs.Attribute) -> str | None:
    return a.metadata.get(UNIT)
