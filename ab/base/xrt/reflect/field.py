"""The one way to declare a config field: an attrs field whose metadata carries help text,
the HF `config.json` key it maps to, and a unit. Everything else in `xrt.reflect` reads this."""

from __future__ import annotations

from typing import Any

import attrs

HELP = "xrt.help"
HF_KEY = "xrt.hf"
UNIT = "xrt.unit"
HF_DEFAULT = "xrt.hf_default"


def field(
    default: Any = attrs.NOTHING,
    *,
    help: str,
    hf: str | tuple[str, ...] | None = None,
    hf_default: Any = attrs.NOTHING,
    unit: str | None = None,
    validator: Any = None,
    factory: Any = None,
) -> Any:
    """A reflected attrs field. `validator` takes reflect validators (or any attrs validator).

    `hf` names the HF `config.json` key; a dotted key reaches into a nested object
    (`rope_parameters.rope_theta`), and a tuple lists alternatives tried in order. `hf_default`: the value an
    HF config takes when config.json lacks the key; without one the key is required (see `hf_missing`)."""
    metadata = {HELP: help, HF_KEY: hf, HF_DEFAULT: hf_default, UNIT: unit}
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


def hf_default_of(a: attrs.Attribute) -> Any:
    """The value for a config.json that lacks the field's HF key, or attrs.NOTHING when the key is required."""
    return a.metadata.get(HF_DEFAULT, attrs.NOTHING)


def unit_of(a: attrs.Attribute) -> str | None:
    return a.metadata.get(UNIT)
