"""Rank 0's watch over the worker processes it spawned: the first one to end outside a shutdown is the run's
failure, described by the error the rank left in the store (`groups.report_failure`) or by how it ended
(exit status, signal). On a failure the watchdog calls `on_failure` at once, which stops the other workers
so that whatever rank 0 waits on (a collective, the step channel) fails now instead of at the timeout."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

import torch.distributed as dist

from xrt.distributed.groups import reported_failure


def describe(rank: int, exitcode: int | None, reported: str | None) -> str:
    if reported:
        return f"tensor-parallel rank {rank} failed: {reported}"
    if exitcode is not None and exitcode < 0:
        try:
            how = f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"killed by signal {-exitcode}"
        return f"tensor-parallel rank {rank} died ({how})"
    return f"tensor-parallel rank {rank} exited unexpectedly (status {exitcode})"


class Watchdog:
    def __init__(self, processes: dict[int, BaseProcess], store: dist.Store, on_failure: Callable[[int], None]) -> None:
        self._processes = processes
        self._store = store
        self._on_failure = on_failure
        self._failed = threading.Event()
        self.failure: str | None = None
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="xrt-tp-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        by_sentinel = {p.sentinel: rank for rank, p in self._processes.items()}
        ready = wait([*by_sentinel, self._wake_r])
        if self._stopping:
            return
        rank = next(by_sentinel[s] for s in ready if s in by_sentinel)
        process = self._processes[rank]
        process.join(timeout=1.0)
        self.failure = describe(rank, process.exitcode, reported_failure(self._store, rank))
        self._failed.set()
        self._on_failure(rank)

    def wait_failure(self, timeout_s: float) -> str | None:
        """The failure, waiting up to timeout_s for one (a collective can fail before the process is reaped)."""
        self._failed.wait(timeout_s)
        return self.failure

    def stop(self) -> None:
        """Workers ending from now on are a shutdown, not a failure."""
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        self._thread.join(timeout=1.0)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
