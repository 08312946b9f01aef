"""attrs validators whose messages read well after a dotted path:
`cache.kv_size_gb: must be > 0, got -1`. They raise ValueError("must be ..., got ...");
`xrt.reflect.build` prefixes the path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

Validator = Callable[[Any, attrs.Attribute, Any], None]


def _show(value: Any) -> str:
    # A float field given `-1` reads back as the user typed it, not as `-1.0`.
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    # Python refuses to print an int of more than 4300 digits; past a few dozen the digits say nothing.
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"{'a negative' if value < 0 else 'an'} integer of {value.bit_length()} bits"
    return repr(value)


def _make(ok: Callable[[Any], bool], expected: str) -> Validator:
    def check(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
        if value is not None and not ok(value):
            raise ValueError(f"must be {expected}, got {_show(value)}")

    check.expected = expected  # type: ignore[attr-defined]  # read by the JSON Schema / help
    return check


def ge(lo: float) -> Validator:
    v = _make(lambda x: x >= lo, f">= {lo}")
    v.minimum = lo  # type: ignore[attr-defined]
    return v


def gt(lo: float) -> Validator:
    v = _make(lambda x: x > lo, f"> {lo}")
    v.exclusive_minimum = lo  # type: ignore[attr-defined]
    return v


def le(hi: float) -> Validator:
    v = _make(lambda x: x <= hi, f"<= {hi}")
    v.maximum = hi  # type: ignore[attr-defined]
    return v


def in_range(lo: float, hi: float, *, lo_open: bool = False) -> Validator:
    """lo <= x <= hi (or lo < x <= hi with lo_open)."""
    if lo_open:
        v = _make(lambda x: lo < x <= hi, f"in ({lo}, {hi}]")
        v.exclusive_minimum = lo  # type: ignore[attr-defined]
    else:
        v = _make(lambda x: lo <= x <= hi, f"in [{lo}, {hi}]")
        v.minimum = lo  # type: ignore[attr-defined]
    v.maximum = hi  # type: ignore[attr-defined]
    return v


def power_of_two() -> Validator:
    return _make(lambda x: x > 0 and (x & (x - 1)) == 0, "a power of two")


def each(inner: Validator) -> Validator:
    """Apply `inner` to every element of a list field."""

    def check(inst: Any, attr: attrs.Attribute, value: Any) -> None:
        for i, x in enumerate(value or []):
            try:
                inner(inst, attr, x)
            except ValueError as e:
                raise ValueError(f"element {i} {e}") from None

    check.expected = getattr(inner, "expected", "")  # type: ignore[attr-defined]
    check.items = inner  # type: ignore[attr-defined]  # the JSON Schema puts inner's bounds on `items`
    return check
