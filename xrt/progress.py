"""Progress of a long loop (loading weights, capturing CUDA graphs, generating): a tqdm bar when stderr is a
terminal; otherwise log lines through the xrt logger, since a CI log or a file would get every redraw of a bar.

The bar's rate is the average since the start (tqdm's `smoothing=0`), not a moving average: requests finish in
bursts and one tensor (the embedding) can outweigh a hundred others, so a moving average swings the estimate.
Before MIN_ETA_S have passed it shows no estimate at all. Log lines come once the run has lasted LOG_AFTER_S,
at each quarter done or every LOG_EVERY_S, whichever is first, and one line at the end (`final`), so a run
shorter than a second logs just that one line. `poll()` shows what moves between units (a generating run's
tokens, in the postfix): a unit can take a minute, and a bar or log that waits for it looks hung."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType

from tqdm import tqdm

from xrt.log import get_logger
from xrt.units import DECIMAL_UNITS

MIN_ETA_S = 1.0
LOG_AFTER_S = 1.0
LOG_EVERY_S = 5.0
# The bar redrawn by poll() at most this often (a step can take a millisecond).
REDRAW_S = 0.2

_BAR = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
_BAR_NO_ETA = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]"


class Bar(tqdm):
    """tqdm with its estimate left out for the first MIN_ETA_S (the first items say little of the rate)."""

    @property
    def format_dict(self):  # noqa: ANN201
        d = super().format_dict
        d["bar_format"] = _BAR_NO_ETA if d["elapsed"] < MIN_ETA_S else _BAR
        return d


def format_bytes(n: float, total: float) -> str:
    """`1.2/2.4 GB`: both in the decimal unit that suits the total."""
    for scale, unit in DECIMAL_UNITS:
        if total >= scale:
            return f"{n / scale:.1f}/{total / scale:.1f} {unit}"
    return f"{n:.0f}/{total:.0f} B"


class Progress:
    """`with Progress(total, "loading weights", "tensor", total_bytes=...) as p: ... p.update(1, nbytes)`.

    show=False: nothing at all. tty=None: a bar if sys.stderr is a terminal, else log lines. final=False: no
    closing log line (for a caller that logs its own summary). `clock` is for tests."""

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str,
        *,
        total_bytes: int | None = None,
        show: bool = True,
        tty: bool | None = None,
        final: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.total, self.desc, self.unit, self.total_bytes = total, desc, unit, total_bytes
        self.n, self.nbytes, self.postfix = 0, 0, ""
        self.show, self.final, self.clock = show, final, clock
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.start = self.last_line = clock()
        self.quarter = 0
        self.log = get_logger(__name__)
        self.bar: tqdm | None = None
        if show and self.tty:
            self.bar = Bar(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, smoothing=0)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close(ok=kind is None)

    def _extra(self) -> str:
        parts = [format_bytes(self.nbytes, self.total_bytes)] if self.total_bytes else []
        return "".join(f", {p}" for p in [*parts, self.postfix] if p)

    def line(self) -> str:
        return f"{self.desc}: {self.n}/{self.total} {self.unit}s{self._extra()}"

    def _log_due(self, now: float, quarter: int) -> bool:
        return now - self.start >= LOG_AFTER_S and (quarter > self.quarter or now - self.last_line >= LOG_EVERY_S)

    def _log(self, now: float, quarter: int) -> None:
        self.quarter, self.last_line = quarter, now
        self.log.info(f"{self.line()}, {now - self.start:.0f} s")

    def update(self, n: int = 1, nbytes: int = 0) -> None:
        self.n += n
        self.nbytes += nbytes
        if self.bar is not None:
            if self.total_bytes:
                self.bar.set_postfix_str(self._extra().removeprefix(", "), refresh=False)
            self.bar.update(n)
        elif self.show and self.n < self.total:
            now = self.clock()
            quarter = 4 * self.n // self.total if self.total else 0
            if self._log_due(now, quarter):
                self._log(now, quarter)

    def poll(self) -> None:
        """Nothing finished, but the postfix may have moved: the bar redrawn (at most every REDRAW_S, elapsed time
        included), or a log line when one is due."""
        if not self.show or self.n >= self.total:
            return
        now = self.clock()
        if self.bar is not None:
            if now - self.last_line >= REDRAW_S:
                self.last_line = now
                self.bar.refresh()
        elif self._log_due(now, self.quarter):
            self._log(now, self.quarter)

    def set_postfix(self, text: str) -> None:
        """A note after the counts (`tok_s=812.3`), on the bar and in the next log line."""
        self.postfix = text
        if self.bar is not None:
            self.bar.set_postfix_str(self._extra().removeprefix(", "), refresh=False)

    def close(self, ok: bool = True) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.show and self.final and ok and self.n:
            self.log.info(f"{self.line()} in {self.clock() - self.start:.2f} s")
        self.show = False
