"""What a checkpoint's config.json must hold for xrt to take the model's shape from it. Torch-free: config
composition checks it before anything is loaded."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from xrt.config import ModelArgs
from xrt.models.errors import CheckpointError
from xrt.reflect import FieldInfo, hf_missing


def missing_shape_keys(data: Mapping[str, Any], explicit: Collection[str] = ()) -> list[FieldInfo]:
    """ModelArgs fields whose config.json key (hidden_size, head_dim, ...) `data` lacks and that have no HF
    default: another model's value (the model= group's, or a default) would be used silently. A field in
    `explicit` (`model.head_dim` set on the command line) is given, so its key may be absent."""
    return [info for info in hf_missing(ModelArgs, data) if f"model.{info.path}" not in explicit]


def missing_message(file: str, missing: list[FieldInfo]) -> str:
    keys = ", ".join(str(info.hf_key) for info in missing)
    return f"{file}: missing {keys}; a checkpoint's config.json must give the model's shape"


def check_shape_keys(file: str, data: Mapping[str, Any]) -> None:
    missing = missing_shape_keys(data)
    if missing:
        raise CheckpointError(missing_message(file, missing))
