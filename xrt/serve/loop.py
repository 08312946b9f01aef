"""The engine loop: one thread owns the LLMEngine and runs `step_stream()` while any request is live; the asyncio
side (the HTTP handlers) only hands it requests and aborts through an inbox, taken between steps, and gets each
step's deltas back through `loop.call_soon_threadsafe` (one call per step), so no HTTP work ever waits inside a step
and no step waits on a client. A `Job` is one HTTP request: its choices (one engine request each) and the asyncio
queue their deltas arrive on, as (choice index, StreamOutput); the last delta of each choice has its output."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Any

from xrt.engine.engine import LLMEngine, Request
from xrt.engine.outputs import StreamOutput
from xrt.log import get_logger
from xrt.serve.errors import APIError
from xrt.serve.jobs import Choice, Job
from xrt.serve.metrics import Metrics

log = get_logger(__name__)

# How long the idle thread sleeps between looks at its inbox when nothing wakes it (a wake-up is immediate).
_IDLE_WAIT_S = 1.0


class EngineFailed(Exception):
    """The engine loop stopped on an error: every live request ends with it."""


class EngineLoop:
    def __init__(self, engine: LLMEngine, metrics: Metrics, max_live: int) -> None:
        """max_live: most choices live at once; one more is refused with 503 (scheduler.max_num_seqs running plus
        serve.max_queued waiting)."""
        self.engine = engine
        self.metrics = metrics
        self.max_live = max_live
        self.live = 0  # choices submitted and not finished (event loop thread only)
        self.error: BaseException | None = None
        self._inbox: deque[tuple[str, Any]] = deque()  # appended by the event loop, taken by the engine thread
        self._wake = threading.Event()
        self._stopping = False
        self._by_id: dict[int, Choice] = {}  # engine thread only
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="xrt-engine-loop", daemon=True)

    def start(self, aloop: asyncio.AbstractEventLoop) -> None:
        self._aloop = aloop
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def submit(self, requests: list[Request], received: float | None = None) -> Job:
        """Queues a request's choices (on the event loop's thread); APIError 503 beyond the queue bound.
        received: perf_counter() when the handler got the request, the arrival its latencies count from (reading
        and checking the body is part of what a client waits for)."""
        if self.error is not None or not self.running:
            raise APIError(503, "the server is shutting down" if self.error is None else
                           f"the engine stopped on an error: {self.error}")
        if self.live + len(requests) > self.max_live:
            raise APIError(503, f"the server holds {self.live} requests, its limit is {self.max_live} "
                           "(scheduler.max_num_seqs running + serve.max_queued waiting); retry later",
                           code="queue_full")
        job = Job(asyncio.Queue())
        now = time.perf_counter() if received is None else received
        job.choices = [Choice(job, i, r, now) for i, r in enumerate(requests)]
        job.unfinished = len(requests)
        self.live += len(requests)
        self._inbox.extend(("add", c) for c in job.choices)
        self._wake.set()
        return job

    def abort(self, job: Job) -> None:
        """Ends a job's unfinished choices (a client that left, a cancelled handler); idempotent."""
        if job.done or job.aborted:
            return
        job.aborted = True
        self._inbox.append(("abort", job))
        self._wake.set()

    def abort_all(self) -> None:
        """Ends every live request (the end of a shutdown's grace period); thread-safe: the engine thread does it
        between steps, and each client gets its last chunk (finish_reason "abort")."""
        self._inbox.append(("abort_all", None))
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Aborts what is left, lets the thread deliver the last deltas and leave (the engine stays open)."""
        self._stopping = True
        self.abort_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # ------------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                self._wake.clear()  # before the inbox is read: a submit after this sets it again
                self._take_inbox()
                if engine.has_unfinished():
                    self._deliver(engine.step_stream())
                elif self._stopping:
                    break
                else:
                    self._wake.wait(_IDLE_WAIT_S)
                self.metrics.engine_state(engine)
        except BaseException as e:  # noqa: BLE001 -- reported to every client and on /health, never silent
            log.error(f"engine loop stopped: {type(e).__name__}: {e}")
            self.error = e
            self._fail_all(EngineFailed(f"{type(e).__name__}: {e}"))

    def _take_inbox(self) -> None:
        while self._inbox:
            op, item = self._inbox.popleft()
            if op == "add":
                if item.job.aborted:
                    self._post([(item, StreamOutput(-1, [], "", None))], aborted_before_start=True)
                    continue
                item.request_id = self.engine.queue(item.request, stream=True)
                self._by_id[item.request_id] = item
            elif op == "abort":
                for c in item.choices:
                    if c.request_id >= 0:
                        self.engine.abort(c.request_id)
            else:  # abort_all
                for rid in list(self._by_id):
                    self.engine.abort(rid)

    def _deliver(self, deltas: list[StreamOutput]) -> None:
        items = []
        for d in deltas:
            choice = self._by_id.get(d.request_id)
            if choice is None:
                continue
            if d.finished:
                del self._by_id[d.request_id]
            items.append((choice, d))
        if items:
            self._post(items)

    def _fail_all(self, error: EngineFailed) -> None:
        items = [(c, error) for c in self._by_id.values()]
        self._by_id.clear()
        while self._inbox:  # added but never queued
            op, item = self._inbox.popleft()
            if op == "add":
                items.append((item, error))
        if items:
            self._post(items)

    def _post(self, items: list[tuple[Choice, Any]], aborted_before_start: bool = False) -> None:
        assert self._aloop is not None
        try:
            self._aloop.call_soon_threadsafe(self._dispatch, items, aborted_before_start)
        except RuntimeError:  # the event loop has closed: nobody is waiting any more
            pass

    # ------------------------------------------------------------------ back on the event loop's thread

    def _dispatch(self, items: list[tuple[Choice, Any]], aborted_before_start: bool) -> None:
        # Latencies are read here, when the event loop has the tokens to send, not when the step ended: the wait for
        # this thread (the GIL, other handlers) is part of what a client waits for.
        now = time.perf_counter()
        for choice, item in items:
            failed = isinstance(item, EngineFailed)
            if not (aborted_before_start or failed):
                self.metrics.observe(choice, item, now)
            last = aborted_before_start or failed or item.finished
            if last:
                choice.job.unfinished -= 1
                self.live -= 1
            if not aborted_before_start:
                choice.job.queue.put_nowait((choice.index, item))
