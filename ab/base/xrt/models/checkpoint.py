"""Which checkpoint directory a model config means, making the tiny test checkpoint on first use."""

from __future__ import annotations

import os

from xrt.config import LoadFormat, ModelArgs
from xrt.log import get_logger
from xrt.models.errors import CheckpointError
from xrt.models.hub import checkpoint_dir
from xrt.models.tiny import is_tiny_checkpoint, make_tiny_checkpoint, tiny_fingerprint

__all__ = ["CheckpointError", "cache_dir", "resolve_checkpoint", "TINY_NAME", "TINY_SEED"]

TINY_NAME = "qwen3-tiny"
# The tiny checkpoint's weights are fixed, independent of the run's seed, so every run shares one cache entry.
TINY_SEED = 0


def cache_dir() -> str:
    """$XRT_CACHE_DIR, else $XDG_CACHE_HOME/xrt, else ~/.cache/xrt."""
    if os.environ.get("XRT_CACHE_DIR"):
        return os.path.expanduser(os.environ["XRT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "xrt")


def tiny_checkpoint_dir(model: ModelArgs) -> str:
    return os.path.join(cache_dir(), f"{TINY_NAME}-{tiny_fingerprint(model, TINY_SEED)}")


def resolve_checkpoint(model: ModelArgs) -> str | None:
    """The checkpoint directory for `model` (model.path, or the cached snapshot of the Hub id it spells; the tiny
    checkpoint, made on first use), or None for dummy weights."""
    if model.load_format is LoadFormat.DUMMY:
        return None
    if model.path:
        try:
            return checkpoint_dir(model.path)
        except CheckpointError as e:
            raise CheckpointError(f"model.path: {e}") from None
    if model.name == TINY_NAME:
        path = tiny_checkpoint_dir(model)
        if not is_tiny_checkpoint(path):
            make_tiny_checkpoint(path, model, TINY_SEED)
            get_logger(__name__).info("wrote the tiny Qwen3 checkpoint to %s", path)
        return path
    raise CheckpointError(
        f"model.path: empty for model.name={model.name}; set model.path to an HF checkpoint directory "
        f"or model.load_format=dummy for random weights"
    )
