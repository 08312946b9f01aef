"""Which checkpoint directory a model config means, making the tiny test checkpoint on first use."""

from __future__ import annotations

import os

from xrt.checkpoint.errors import CheckpointError
from xrt.checkpoint.hub import checkpoint_dir
from xrt.config import LoadFormat, ModelArgs
from xrt.log import get_logger
from xrt.models.tiny import is_tiny_checkpoint, make_tiny_checkpoint, tiny_fingerprint

__all__ = ["CheckpointError", "cache_dir", "checkpoint_problem", "resolve_checkpoint", "TINY_NAME", "TINY_SEED"]

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
            try:
                make_tiny_checkpoint(path, model, TINY_SEED)
            except OSError as e:
                raise CheckpointError(_cache_dir_error(f"cannot write the tiny checkpoint to {path}: "
                                                       f"{e.strerror or e}")) from None
            get_logger(__name__).info("wrote the tiny Qwen3 checkpoint to %s", path)
        return path
    raise CheckpointError(_no_path(model))


def _no_path(model: ModelArgs) -> str:
    return (f"model.path: empty for model.name={model.name}; set model.path to an HF checkpoint directory "
            f"or model.load_format=dummy for random weights")


def _cache_dir_error(what: str) -> str:
    """`what` went wrong in the cache directory, said with where that directory comes from."""
    given = os.environ.get("XRT_CACHE_DIR")
    if given:
        return f"XRT_CACHE_DIR={given}: {what}; point XRT_CACHE_DIR at a writable directory"
    return f"{what} (the default cache directory; set XRT_CACHE_DIR to a writable directory)"


def checkpoint_problem(model: ModelArgs) -> str | None:
    """Why resolve_checkpoint would fail, found before anything is made or loaded (`config validate`, the CLI's
    checks): a model other than the tiny one without model.path, a cache directory the tiny checkpoint cannot be
    made in. A line naming the field or variable, or None."""
    if model.load_format is LoadFormat.DUMMY:
        return None
    if model.path:
        try:
            checkpoint_dir(model.path)
        except CheckpointError as e:
            return f"model.path: {e}"
        return None
    if model.name != TINY_NAME:
        return _no_path(model)
    if is_tiny_checkpoint(tiny_checkpoint_dir(model)):
        return None
    root = os.path.abspath(cache_dir())
    ancestor = root
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        return _cache_dir_error(f"{ancestor} is a file, so the tiny checkpoint cannot be made under {root}")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return _cache_dir_error(f"cannot write in {ancestor} (permission denied), where the tiny checkpoint is made")
    return None
