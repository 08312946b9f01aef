"""Sampling parameters as a request gives them (SamplingArgs, a dict or None), checked against the
schema's validators with errors that name the field."""

from __future__ import annotations

from typing import Any

import attrs

from xrt.config import SamplingArgs


def validate_sampling(sampling: SamplingArgs | dict[str, Any] | None, default: SamplingArgs) -> SamplingArgs:
    """A checked copy; errors name the field: `sampling.top_p: must be in (0.0, 1.0], got 0`."""
    if sampling is None:
        return attrs.evolve(default)
    if isinstance(sampling, dict):
        names = {a.name for a in attrs.fields(SamplingArgs)}
        unknown = sorted(set(sampling) - names)
        if unknown:
            raise ValueError(f"sampling.{unknown[0]}: unknown field (expected one of {', '.join(sorted(names))})")
        with attrs.validators.disabled():
            sampling = attrs.evolve(default, **sampling)
    elif not isinstance(sampling, SamplingArgs):
        raise ValueError(f"sampling: expected SamplingArgs or a dict, got {type(sampling).__name__}")
    for a in attrs.fields(SamplingArgs):
        value = getattr(sampling, a.name)
        if a.validator is None:
            continue
        try:
            a.validator(sampling, a, value)
        except (ValueError, TypeError) as e:
            raise ValueError(f"sampling.{a.name}: {e}") from None
    if not isinstance(sampling.stop, list) or not all(isinstance(s, str) for s in sampling.stop):
        raise ValueError(f"sampling.stop: must be a list of strings, got {sampling.stop!r}")
    return attrs.evolve(sampling, stop=list(sampling.stop))
