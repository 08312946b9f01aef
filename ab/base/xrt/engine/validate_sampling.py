"""Sampling parameters as a request gives them (SamplingArgs, a dict or None), built through the schema
(`xrt.reflect.build`), so the Python API converts, bounds and names fields exactly as the CLI and YAML do."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xrt.config import SamplingArgs
from xrt.engine.errors import RequestError
from xrt.reflect import ConfigError, build, to_dict


def validate_sampling(sampling: object, default: SamplingArgs, where: str = "sampling") -> SamplingArgs:
    """A checked copy; a dict overrides `default` field by field. Raises RequestError naming the field:
    `sampling.top_p: must be in (0.0, 1.0], got 0` (every problem, `; `-joined on one line)."""
    if sampling is None or isinstance(sampling, SamplingArgs):
        # Rebuilt, not trusted (cfg.sampling too): attrs validators check bounds, not types.
        mapping: dict[Any, Any] = to_dict(default if sampling is None else sampling)
    elif isinstance(sampling, Mapping):
        mapping = {**to_dict(default), **sampling}
    else:
        raise RequestError(where, f"expected SamplingArgs, a dict or None, got {type(sampling).__name__}")
    try:
        return build(SamplingArgs, mapping, path=where)
    except ConfigError as e:
        (path, first), rest = e.problems[0], e.lines()[1:]
        raise RequestError(path, "; ".join([first, *rest])) from None
