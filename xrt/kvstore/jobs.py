"""`JobThread`: a daemon thread that does queued jobs in order (the prefetcher's and the reader's). A job that
raises is logged and counted, never the end of the thread; `flush` waits for the queue, bounded; `close` flushes,
then stops the thread (one still busy after the bound is left behind: a daemon)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from xrt.log import get_logger

log = get_logger(__name__)
T = TypeVar("T")


class JobThread(Generic[T]):
    def __init__(self, name: str, handle: Callable[[T], None], on_error: Callable[[Exception], None],
                 maxsize: int = 0) -> None:
        self._handle, self._on_error = handle, on_error
        self.jobs: queue.Queue[T | None] = queue.Queue(maxsize)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: T) -> bool:
        """Queue the job; False when the queue is full or the thread gone (nothing queued)."""
        if not self._thread.is_alive():
            return False
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            return False
        return True

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                if job is None:
                    return
                self._handle(job)
            except Exception as e:  # noqa: BLE001  a failed job is logged and counted, never a dead thread
                self._on_error(e)
            finally:
                self.jobs.task_done()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued job is done, at most timeout_s; False when they were not by then."""
        with self.jobs.all_tasks_done:
            return self.jobs.all_tasks_done.wait_for(lambda: not self.jobs.unfinished_tasks, timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        done = self.flush(timeout_s)
        try:
            self.jobs.put(None, timeout=timeout_s if done else 0.01)
        except queue.Full:
            return
        self._thread.join(None if done else 0.01)  # done: nothing left but the stop item
