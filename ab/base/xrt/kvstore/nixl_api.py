"""The NIXL Python API, from whichever NIXL wheel is installed.

`nixl` (the meta package) picks nixl_cu12 or nixl_cu13 by torch's CUDA major but depends on both (two ~60 MB
wheels); the `kv` extra installs nixl-cu13 alone, which is enough for the POSIX backend on a machine without
CUDA libraries. A GPU user with a CUDA 12 torch installs nixl-cu12 instead (README: KV tiers), so both single
wheels are tried after the meta package."""

from __future__ import annotations

import logging
import os
import sys
from types import ModuleType


class NixlUnavailable(RuntimeError):
    """No NIXL wheel is installed: the L2 tier cannot run."""


def nixl_api() -> ModuleType:
    """The module holding `nixl_agent` and `nixl_agent_config`."""
    try:
        import nixl._api as api  # the meta package: matches torch's CUDA major when both wheels are present
    except ModuleNotFoundError:
        try:
            import nixl_cu13._api as api
        except ModuleNotFoundError:
            try:
                import nixl_cu12._api as api
            except ModuleNotFoundError as e:
                raise NixlUnavailable(
                    "cache.l2 needs NIXL: pip install --no-deps 'nixl-cu13==1.5.1' (or nixl-cu12 for a CUDA 12 torch)"
                ) from e
    _quiet_logging()
    return api


def _quiet_logging() -> None:
    """NIXL's Python logger writes INFO lines (every agent and backend made) to stdout, where `xrt run` prints
    its generations: keep it to warnings (NIXL_LOG_LEVEL, NIXL's own variable, still wins) and on stderr."""
    logger = logging.getLogger("nixl")
    if not os.environ.get("NIXL_LOG_LEVEL"):
        logger.setLevel(logging.WARNING)
    for h in logger.handlers:
        if isinstance(h, logging.StreamHandler) and h.stream is sys.stdout:
            h.setStream(sys.stderr)
