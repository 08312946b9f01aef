"""A checkpoint's config.json checked at load: it must give the model's shape (what is missing:
`xrt.config.shape_keys`, which config composition asks too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xrt.checkpoint.errors import CheckpointError
from xrt.config.shape_keys import missing_message, missing_shape_keys


def check_shape_keys(file: str, data: Mapping[str, Any]) -> None:
    missing = missing_shape_keys(data)
    if missing:
        raise CheckpointError(missing_message(file, missing))
