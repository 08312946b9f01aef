"""xrt's one logger. Every module logs through `get_logger(__name__)` (a child of the `xrt` logger);
lines go to stderr as `[xrt] message`, or `[xrt rank N] message` on tensor-parallel ranks other than 0, so
the output of several ranks can be told apart. The level comes from the config (`log_level`) or the CLI's
`-v` / `-q`; result lines a command prints on purpose (generations, bench rows) are not log lines."""

from __future__ import annotations

import logging
import os
import sys

ROOT = "xrt"
LEVELS = ("debug", "info", "warning", "error")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (pytest and callers may swap it after import)."""

    def __init__(self) -> None:
        super().__init__()

    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # noqa: ANN001
        pass


class _RankPrefix(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.rank = int(os.environ.get("RANK", "0") or 0)

    def filter(self, record: logging.LogRecord) -> bool:
        record.xrt_prefix = f"[xrt rank {self.rank}]" if self.rank else "[xrt]"
        return True


_PREFIX = _RankPrefix()


def _root() -> logging.Logger:
    logger = logging.getLogger(ROOT)
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.addFilter(_PREFIX)
        handler.setFormatter(logging.Formatter("%(xrt_prefix)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        # xrt's lines are formatted here; an application's root handler would print them twice.
        logger.propagate = False
    return logger


def get_logger(name: str) -> logging.Logger:
    """The logger for module `name` (`xrt.executor.runner` -> child of `xrt`)."""
    _root()
    return logging.getLogger(name if name == ROOT or name.startswith(ROOT + ".") else f"{ROOT}.{name}")


def set_level(level: str | int) -> None:
    """`debug`, `info`, `warning`, `error` (or a logging level number) for every xrt logger."""
    value = level if isinstance(level, int) else logging.getLevelName(str(level).upper())
    if not isinstance(value, int):
        raise ValueError(f"log_level: expected one of {', '.join(LEVELS)}, got {level!r}")
    _root().setLevel(value)


def set_rank(rank: int) -> None:
    """Prefix this process's lines with its tensor-parallel rank (rank 0 keeps the plain prefix)."""
    _PREFIX.rank = rank
