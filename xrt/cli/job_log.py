"""A multirun job's log file, `<job dir>/<command>.log`. Hydra's job logging opens it as a file handler on the root
logger, but xrt's logger does not propagate there (`xrt/log.py` formats its own `[xrt]` lines on stderr) and a
command's results and errors are printed, not logged, so the file stayed empty. For the job's duration `job_log`
copies every line the job writes on stdout and stderr (its `[xrt]` log lines at the job's `log_level`, `[bench]`
lines, a run's generations, `error:` lines) into that file, as Hydra's formatter writes a record: what the job
showed, each line with its time and stream. `sweep_logging` quiets what a sweeper's libraries log around the
jobs (alembic's import-time lines, optuna's colour codes in a file or pipe)."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class LineTee(io.TextIOBase):
    """Writes through to `stream` and hands every complete line to `handlers` as an INFO record of logger
    `name`. A line redrawn with carriage returns (a progress bar on a terminal) is filed as last drawn."""

    def __init__(self, stream: TextIO, handlers: list[logging.Handler], name: str) -> None:
        super().__init__()
        self.stream, self.handlers, self.name, self.pending = stream, handlers, name, ""

    def write(self, text: str) -> int:
        n = self.stream.write(text)
        *done, self.pending = (self.pending + text).split("\n")
        for line in done:
            self._file(line)
        return n

    def _file(self, line: str) -> None:
        line = line.rstrip("\r").rpartition("\r")[2]
        if not line:
            return
        record = logging.LogRecord(self.name, logging.INFO, __file__, 0, line, None, None)
        for h in self.handlers:
            h.handle(record)

    def flush(self) -> None:
        self.stream.flush()

    def close_line(self) -> None:
        """A last line written without its newline still reaches the file."""
        if self.pending:
            self._file(self.pending)
            self.pending = ""

    def isatty(self) -> bool:  # a bar or colours are the real stream's decision
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    def __getattr__(self, name: str) -> Any:  # encoding, errors, buffer, ...: the real stream's
        return getattr(self.stream, name)


@contextmanager
def job_log() -> Iterator[list[logging.Handler]]:
    """While a job runs, what it writes on stdout and stderr also goes to the root logger's file handlers (Hydra's
    job log). Yields those handlers: none outside Hydra's job logging (e.g. `hydra/job_logging=disabled`)."""
    files: list[logging.Handler] = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    if not files:
        yield files
        return
    out, err = sys.stdout, sys.stderr
    tee_out, tee_err = LineTee(out, files, "stdout"), LineTee(err, files, "stderr")
    sys.stdout, sys.stderr = tee_out, tee_err
    try:
        yield files
    finally:
        tee_out.close_line()
        tee_err.close_line()
        if sys.stdout is tee_out:
            sys.stdout = out
        if sys.stderr is tee_err:
            sys.stderr = err


# Loggers of libraries a sweeper brings in that log at INFO what no user asked for: alembic (imported by optuna's RDB
# storage: seven "setup plugin ..." lines through Hydra's root handler) and optuna ("A new study created", which
# Hydra's own [HYDRA] lines repeat). Their warnings still show.
QUIET = ("alembic", "optuna")


@contextmanager
def sweep_logging(sweeper: str) -> Iterator[None]:
    """Around a multirun: QUIET's loggers at WARNING, and optuna's colorlog formatter in colour only when its
    stream is a terminal (colorlog colours unless told the stream); as they were afterwards."""
    if "optuna" in sweeper:
        try:
            import optuna  # its handler and level (INFO) are set as it is imported: before ours
        except ImportError:  # the sweep itself says so, as Hydra's error
            pass
        else:
            for h in logging.getLogger(optuna.__name__).handlers:
                _colour_only_on_a_tty(h)
    loggers = [logging.getLogger(name) for name in QUIET]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _colour_only_on_a_tty(handler: logging.Handler) -> None:
    formatter, stream = handler.formatter, getattr(handler, "stream", None)
    # colorlog's ColoredFormatter leaves colour out when its `stream` is no terminal; optuna's gives it none.
    if formatter is not None and hasattr(formatter, "no_color") and getattr(formatter, "stream", None) is None:
        formatter.stream = stream  # type: ignore[attr-defined]


__all__ = ["QUIET", "LineTee", "job_log", "sweep_logging"]
